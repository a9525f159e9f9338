// SPEC §4: timestep gating for diffusion pipelines. Implemented in src/core/gating.cpp.
#pragma once

#include <optional>

namespace blasst {

class TimestepGate {
 public:
  // D = disabled_until_timestep in [0, 1] (Error otherwise); nullopt: no gating (always active).
  explicit TimestepGate(std::optional<double> disabled_until = std::nullopt);

  // Publish the current denoise step: t = timestep / num_train_timesteps, must land in [0, 1].
  void record_timestep(double timestep, double num_train_timesteps);
  // Rectified-flow schedulers: publish sigma in [0, 1] directly.
  void record_sigma(double sigma);
  void reset();  // forget the published t (e.g. a new generation)

  // Skipping allowed now? D unset: true. D set and t published: t <= D. D set and nothing
  // published: false, with one warning on stderr for the lifetime of this gate.
  bool active();

  std::optional<double> current() const { return t_; }
  std::optional<double> disabled_until() const { return d_; }

 private:
  std::optional<double> d_;
  std::optional<double> t_;
  bool warned_ = false;
};

}  // namespace blasst
