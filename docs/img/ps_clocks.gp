# Workers' clocks against time with one worker 3x slower (1 server + 4 workers, ThreadComm):
# the data from `bench_ps --trace docs/img/ps_clocks.dat`. Run from the repository root:
#   gnuplot docs/img/ps_clocks.gp
set terminal pngcairo size 1100,330 font ",10"
set output "docs/img/ps_clocks.png"
set multiplot layout 1,4 title "Parameter server, worker 0 three times slower: each worker's clock against time"
set xlabel "ms"
set xrange [0:150]
set yrange [0:60]
set key top left
titles = "BSP SSP(s=1) SSP(s=3) ASP"
do for [m=0:3] {
  set title word(titles, m + 1)
  if (m == 0) { set ylabel "clock (gradients pushed)" } else { unset ylabel }
  plot for [w=0:3] "docs/img/ps_clocks.dat" index (m * 4 + w) using ($3 * 1000):4 with steps lw 2 \
       title (w == 0 ? "worker 0 (slow)" : sprintf("worker %d", w))
}
unset multiplot
