// fa4 — the command-line tool: run, check, bench, info, explain, model, trace.
#include <cstdio>
#include <exception>
#include <string>

#include "fa4/commands.hpp"
#include "fa4/fa4.hpp"

int main(int argc, char** argv) {
  CLI::App app{"fa4: FlashAttention-4 attention (forward and backward) on the GPU or the CPU"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("fa4 ") + fa4::version());
  fa4::cli::add_run_command(app);
  fa4::cli::add_check_command(app);
  fa4::cli::add_bench_command(app);
  fa4::cli::add_info_command(app);
  fa4::cli::add_explain_command(app);
  fa4::cli::add_model_command(app);
  fa4::cli::add_trace_command(app);
  // An unknown command is named as such (CLI11 alone answers "A subcommand is required").
  if (argc > 1 && argv[1][0] != '-') {
    std::string names;
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
      known = known || sub->get_name() == argv[1];
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known) {
      std::fprintf(stderr, "fa4: error: unknown command '%s'; the commands are %s (fa4 --help)\n", argv[1], names.c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const fa4::Error& e) {
    std::fprintf(stderr, "fa4: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fa4: error: %s\n", e.what());
    return 3;
  }
  return fa4::cli::exit_code();
}
