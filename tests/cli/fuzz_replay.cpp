// Runs a fuzz target's LLVMFuzzerTestOneInput without libFuzzer, so that any compiler (and the
// sanitizer builds) can run the committed corpus and the generated seeds of fuzz_seeds.hpp as a
// plain ctest (FuzzReplay.config, FuzzReplay.npy). Linked with fuzz_config.cpp or fuzz_npy.cpp.
//
//   fuzz_replay [--large] [--write-seeds DIR] [PATH...]
//     PATH           a corpus file or folder (every file in it) to run
//     --large        also the full-size generated seeds (150k levels, 200k groups, 16 MiB)
//     --write-seeds  write the generated seeds into DIR (a corpus for libFuzzer) and exit
//
// A crash or sanitizer report ends the process (the test fails); an input that takes more than
// 5 s of CPU time is a failure too (issue 21: no hang over 5 s; see run_one). The target does several passes per input
// (parse, resolve for 3 layers x 2 phases, to_json, parse again); address and undefined-behaviour
// sanitizers make that 3-5x slower, so under them the limit is 15 s.
#include <chrono>
#include <ctime>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz_seeds.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

namespace fs = std::filesystem;
using blasst::fuzz_seeds::Seed;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_UNDEFINED__)
constexpr double kLimitSeconds = 15.0;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(undefined_behavior_sanitizer)
constexpr double kLimitSeconds = 15.0;
#else
constexpr double kLimitSeconds = 5.0;
#endif
#else
constexpr double kLimitSeconds = 5.0;
#endif

std::vector<Seed> generated(bool large) {
#if defined(BLASST_FUZZ_NPY)
  return blasst::fuzz_seeds::npy_seeds(large);
#else
  return blasst::fuzz_seeds::config_seeds(large);
#endif
}

// The limit is on the input's CPU time (the target is single-threaded and does no blocking I/O),
// so that a loaded machine does not fail it: on this 2-core machine with two builds running, the
// 200k-group input took 2.8 s of wall clock for ~1.6 s of CPU, and 3.5-5 s wall under ctest -j2
// (a FuzzReplay.config failure seen while a build ran). A blocking hang, which burns no CPU, is
// caught by the wall-clock bound of 4x the limit.
bool run_one(const std::string& name, const std::string& bytes) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::clock_t c0 = std::clock();
  LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
  const double cpu = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (cpu > kLimitSeconds || s > 4 * kLimitSeconds) {
    std::fprintf(stderr, "FAIL %s (%zu bytes): %.2f s CPU, %.2f s wall; limits %.0f s CPU, %.0f s wall\n",
                 name.c_str(), bytes.size(), cpu, s, kLimitSeconds, 4 * kLimitSeconds);
    return false;
  }
  if (s > 0.5 || bytes.size() > 100000)
    std::printf("  %-28s %10zu bytes %7.3f s CPU %7.3f s wall\n", name.c_str(), bytes.size(), cpu, s);
  return true;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

int main(int argc, char** argv) {
  bool large = false;
  std::string write_dir;
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--large") {
      large = true;
    } else if (a == "--write-seeds" && i + 1 < argc) {
      write_dir = argv[++i];
    } else {
      paths.push_back(a);
    }
  }
  if (!write_dir.empty()) {
    fs::create_directories(write_dir);
    for (const Seed& s : generated(large)) std::ofstream(fs::path(write_dir) / s.name, std::ios::binary) << s.bytes;
    return 0;
  }
  int n = 0, failed = 0;
  for (const std::string& p : paths) {
    std::vector<fs::path> files;
    if (fs::is_directory(p)) {
      for (const auto& e : fs::directory_iterator(p))
        if (e.is_regular_file()) files.push_back(e.path());
    } else {
      files.push_back(p);
    }
    for (const fs::path& f : files) {
      ++n;
      failed += run_one(f.filename().string(), slurp(f)) ? 0 : 1;
    }
  }
  for (const Seed& s : generated(large)) {
    ++n;
    failed += run_one(s.name, s.bytes) ? 0 : 1;
  }
  std::printf("fuzz_replay: %d inputs, %d over the time limit\n", n, failed);
  return failed == 0 ? 0 : 1;
}
