// expect: QSRPolicy\{alpha, h_base, schedule\}: this schedule has no warmup\(\)
// QSRPolicy takes its warm-up from a schedule only when the schedule has warmup();
// ConstantLr has none, and the error says to pass the warm-up steps instead.
#include <commpact/sync/lr_schedule.hpp>
#include <commpact/sync/policies.hpp>

int main() {
  commpact::QSRPolicy q{0.0175, 4, commpact::ConstantLr{0.1}};
  (void)q;
}
