// Each `fa4` subcommand lives in its own file and registers itself here.
#pragma once

#include <CLI/CLI.hpp>

namespace fa4::cli {

void add_run_command(CLI::App& app);
void add_check_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_info_command(CLI::App& app);
void add_explain_command(CLI::App& app);
void add_model_command(CLI::App& app);
void add_trace_command(CLI::App& app);

// Subcommands run from their callbacks during parse and report failure here (0 = success).
void set_exit_code(int code);
int exit_code();

}  // namespace fa4::cli
