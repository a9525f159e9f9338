// SPEC §4: timestep gating. t runs 1 -> 0 over a generation; skipping is active once t <= D.
#include "blasst/gating.hpp"

#include <cmath>
#include <cstdio>
#include <string>

#include "blasst/blasst.hpp"
#include "core/text.hpp"

namespace blasst {

namespace {
bool in_unit(double x) { return std::isfinite(x) && x >= 0.0 && x <= 1.0; }
using detail::num;
}  // namespace

TimestepGate::TimestepGate(std::optional<double> disabled_until) : d_(disabled_until) {
  if (d_ && !in_unit(*d_))
    throw Error("disabled_until_timestep must lie in [0, 1], got " + num(*d_));
}

void TimestepGate::record_timestep(double timestep, double num_train_timesteps) {
  if (!std::isfinite(num_train_timesteps) || num_train_timesteps <= 0.0)
    throw Error("num_train_timesteps must be finite and > 0, got " + num(num_train_timesteps));
  if (!std::isfinite(timestep)) throw Error("timestep must be finite, got " + num(timestep));
  const double t = timestep / num_train_timesteps;
  if (!in_unit(t))
    throw Error("timestep / num_train_timesteps = " + num(t) + " must lie in [0, 1] (timestep " +
                num(timestep) + ", num_train_timesteps " + num(num_train_timesteps) + ")");
  t_ = t;
}

void TimestepGate::record_sigma(double sigma) {
  if (!in_unit(sigma)) throw Error("sigma must lie in [0, 1], got " + num(sigma));
  t_ = sigma;
}

void TimestepGate::reset() { t_.reset(); }

bool TimestepGate::active() {
  if (!d_) return true;
  if (t_) return *t_ <= *d_;
  if (!warned_) {
    warned_ = true;
    std::fprintf(stderr,
                 "blasst: warning: disabled_until_timestep = %s is set but no timestep was "
                 "published; attention runs dense\n",
                 num(*d_).c_str());
  }
  return false;
}

}  // namespace blasst
