set terminal pngcairo size 900,600 noenhanced
set grid
set output 'scaling_comm_vs_p.png'
set logscale y
set xlabel 'P (ranks)'
set ylabel 'communication ms per iteration'
set title 'n = 16777216 floats, density 0.001: measured (points) and model (lines)'
set key outside right
plot 'scaling_comm_vs_p.dat' index 0 using 1:2 with points pt 5 lc 1 title 'dense 1gbit', '' index 0 using 1:3 with lines lc 1 notitle, 'scaling_comm_vs_p.dat' index 1 using 1:2 with points pt 6 lc 1 title 'topk 1gbit', '' index 1 using 1:3 with lines lc 1 notitle, 'scaling_comm_vs_p.dat' index 2 using 1:2 with points pt 7 lc 1 title 'gtopk 1gbit', '' index 2 using 1:3 with lines lc 1 notitle, 'scaling_comm_vs_p.dat' index 3 using 1:2 with points pt 5 lc 2 title 'dense 10gbit', '' index 3 using 1:3 with lines lc 2 notitle, 'scaling_comm_vs_p.dat' index 4 using 1:2 with points pt 6 lc 2 title 'topk 10gbit', '' index 4 using 1:3 with lines lc 2 notitle, 'scaling_comm_vs_p.dat' index 5 using 1:2 with points pt 7 lc 2 title 'gtopk 10gbit', '' index 5 using 1:3 with lines lc 2 notitle
unset logscale y
set output 'scaling_methods.png'
set style data histograms
set style histogram rowstacked
set style fill solid 0.8 border -1
set boxwidth 0.7
set xlabel ''
set ylabel 'ms per iteration'
set xtics rotate by -30
set title 'P = 8, n = 16777216, 1 Gbit/s: compressor compute and communication'
plot 'scaling_methods.dat' using 2:xtic(1) title 'compute', '' using 3 title 'communication'
set style data points
unset xtics
set xtics
set output 'scaling_model.png'
set logscale xy
set xlabel 'measured communication ms'
set ylabel 'model ms'
set title 'models against every measured point'
plot 'scaling_model.dat' using 1:2 pt 7 title 'alpha-beta', '' using 1:3 pt 5 title 'host-aware', x title 'exact', 1.25*x dt 2 title '+25%', 0.75*x dt 2 title '-25%'
