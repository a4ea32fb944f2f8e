// expect: this type is not a SyncPolicy: it needs `commpact::sync_plan plan\(std::int64_t step, double lr\) const`
// plan_run names what a policy lacks (here: its plan() is not const), as DataParallel does.
#include <commpact/sync/lr_schedule.hpp>
#include <commpact/sync/schedule.hpp>

#include <cstdint>

struct NotConst {
  commpact::sync_plan plan(std::int64_t, double) { return {commpact::sync_plan::mode::gradients, 1}; }
};

int main() {
  const auto periods = commpact::plan_run(NotConst{}, commpact::ConstantLr{0.1}, 10);
  (void)periods;
}
