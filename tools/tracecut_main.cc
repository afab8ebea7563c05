// The `tracecut` command line. Subcommands register themselves
// (tools/cli/common.h); this only dispatches.

#include <iostream>
#include <string>
#include <vector>

#include "tools/cli/common.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  tracecut::cli::Io io{std::cout, std::cerr};
  return tracecut::cli::Main(args, io);
}
