// Internal: each `blasst` subcommand registers itself on the CLI11 app. One file per command.
#pragma once

namespace CLI { class App; }

namespace blasst::cli {

void register_demo(CLI::App& app);       // cmd_demo.cpp
void register_run(CLI::App& app);        // cmd_run.cpp
void register_calibrate(CLI::App& app);  // cmd_calibrate.cpp (calibration, issue 5)

}  // namespace blasst::cli
