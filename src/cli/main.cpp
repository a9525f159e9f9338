// `blasst`: Skip-Softmax sparse attention from the command line (docs/cli.md).
// Every error -- bad arguments, unreadable files, library validation -- prints
// "blasst: error: <message>" on stderr, one printable line of bounded length, and exits with
// status 2.
#include <csignal>
#include <cstdio>
#include <exception>
#include <new>
#include <string>

#include <CLI/CLI.hpp>

#include "blasst/blasst.hpp"
#include "cli/commands.hpp"
#include "core/text.hpp"

#ifndef BLASST_VERSION
#define BLASST_VERSION "unknown"
#endif

namespace {
int fail(const std::string& msg) {
  std::fflush(stdout);
  // The last guard: whatever a message echoes (a CLI11 value, a path, an exception from the
  // standard library) leaves as one printable line.
  std::fprintf(stderr, "blasst: error: %s\n", blasst::detail::printable(msg).c_str());
  return 2;
}
}  // namespace

int main(int argc, char** argv) {
  // A file-size limit (ulimit -f) must fail a write with EFBIG, reported and cleaned up, instead
  // of killing the process with SIGXFSZ halfway through a file.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"blasst: Skip-Softmax sparse attention (BLASST) -- demo, run, calibrate", "blasst"};
  app.set_version_flag("--version", std::string("blasst ") + BLASST_VERSION);
  app.require_subcommand(1);
  app.fallthrough(false);
  blasst::cli::register_demo(app);
  blasst::cli::register_run(app);
#ifdef BLASST_HAVE_CALIBRATE
  blasst::cli::register_calibrate(app);
#endif
  // CLI11 would only say "A subcommand is required" for a mistyped command: name it.
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    std::string names;
    for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
      known = known || sub->get_name() == argv[1];
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known)
      return fail("unknown command " + blasst::detail::single_quoted(argv[1]) + " (commands: " + names + ")");
  }
  try {
    app.parse(argc, argv);  // subcommand callbacks run inside parse()
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return fail(e.what());
  } catch (const blasst::Error& e) {
    return fail(e.what());
  } catch (const std::bad_alloc&) {
    return fail(std::string("out of memory in `blasst ") + (argc > 1 ? argv[1] : "") +
                "`: the inputs need more memory than is available");
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  return 0;
}
