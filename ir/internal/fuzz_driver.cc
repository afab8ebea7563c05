// A deterministic stand-in for libFuzzer's main, so fuzz targets run as
// ordinary tests with any compiler:
//
//   cc_test(
//       name = "foo_fuzzer_smoke_test",
//       srcs = ["foo_fuzzer.cc"],  // defines LLVMFuzzerTestOneInput
//       args = ["$(locations :foo_corpus)", "--dict=$(location foo.dict)"],
//       data = [":foo_corpus", "foo.dict"],
//       deps = ["//ir:fuzz_driver", ...],
//   )
//
// Runs the target on every corpus file (arguments naming files or
// directories), then on --iterations deterministic mutations of them (bit
// flips, byte edits, deletions, duplications, splices, dictionary tokens).
// The same flags always run the same inputs. On a crash the input is saved
// to $TEST_UNDECLARED_OUTPUTS_DIR (or the working directory) as
// fuzz_crash_input, to replay with the real fuzzer or this driver.
//
// Flags: --iterations=N (default 5000), --seed=N (default 1),
// --max_len=N (default 65536), --dict=FILE (libFuzzer dictionary format).

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

// The input being run, for the crash handler (no allocation there).
const std::string* g_current = nullptr;
std::string g_crash_path;
std::string g_current_label;

void WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = write(fd, data, size);
    if (n <= 0) return;
    data += n;
    size -= static_cast<size_t>(n);
  }
}

void WriteStr(int fd, const char* s) { WriteAll(fd, s, std::strlen(s)); }

void OnCrash(int sig) {
  WriteStr(2, "\nfuzz_driver: crashed on ");
  WriteStr(2, g_current_label.c_str());
  if (g_current != nullptr) {
    int fd = open(g_crash_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      WriteAll(fd, g_current->data(), g_current->size());
      close(fd);
      WriteStr(2, "; input saved to ");
      WriteStr(2, g_crash_path.c_str());
    }
  }
  WriteStr(2, "\n");
  signal(sig, SIG_DFL);
  raise(sig);
}

// splitmix64: small, fast, and the same everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
    z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n); n > 0.
  size_t Below(size_t n) { return static_cast<size_t>(Next() % n); }

 private:
  uint64_t state_;
};

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

struct Seed {
  std::string name;
  std::string data;
};

void CollectSeeds(const std::string& path, std::vector<Seed>* seeds) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    std::fprintf(stderr, "fuzz_driver: cannot read %s\n", path.c_str());
    std::exit(2);
  }
  if (S_ISDIR(st.st_mode)) {
    std::vector<std::string> names;
    if (DIR* dir = opendir(path.c_str())) {
      while (dirent* e = readdir(dir)) {
        if (e->d_name[0] != '.') names.push_back(e->d_name);
      }
      closedir(dir);
    }
    std::sort(names.begin(), names.end());  // readdir order is arbitrary.
    for (const std::string& n : names) CollectSeeds(path + "/" + n, seeds);
    return;
  }
  Seed s{path, ""};
  if (!ReadFile(path, &s.data)) {
    std::fprintf(stderr, "fuzz_driver: cannot read %s\n", path.c_str());
    std::exit(2);
  }
  seeds->push_back(std::move(s));
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// libFuzzer dictionary: lines `"token"` or `name="token"`, `#` comments,
// escapes \\ \" \xNN.
std::vector<std::string> ReadDictionary(const std::string& path) {
  std::string text;
  if (!ReadFile(path, &text)) {
    std::fprintf(stderr, "fuzz_driver: cannot read dictionary %s\n",
                 path.c_str());
    std::exit(2);
  }
  std::vector<std::string> tokens;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    size_t open = line.find('"');
    size_t close = line.rfind('"');
    if (line.empty() || line[0] == '#' || open == std::string::npos ||
        close <= open) {
      continue;
    }
    std::string token;
    for (size_t i = open + 1; i < close; ++i) {
      if (line[i] == '\\' && i + 1 < close) {
        char e = line[++i];
        if (e == 'x' && i + 2 < close && HexDigit(line[i + 1]) >= 0 &&
            HexDigit(line[i + 2]) >= 0) {
          token.push_back(static_cast<char>(HexDigit(line[i + 1]) * 16 +
                                            HexDigit(line[i + 2])));
          i += 2;
        } else {
          token.push_back(e);
        }
      } else {
        token.push_back(line[i]);
      }
    }
    if (!token.empty()) tokens.push_back(token);
  }
  return tokens;
}

std::string Mutate(const std::vector<Seed>& seeds,
                   const std::vector<std::string>& dict, size_t max_len,
                   Rng& rng, std::string data) {
  int edits = 1 + static_cast<int>(rng.Below(5));
  for (int k = 0; k < edits; ++k) {
    size_t n = data.size();
    switch (rng.Below(dict.empty() ? 7 : 8)) {
      case 0:  // Flip a bit.
        if (n > 0) data[rng.Below(n)] ^= static_cast<char>(1 << rng.Below(8));
        break;
      case 1:  // Overwrite a byte.
        if (n > 0) data[rng.Below(n)] = static_cast<char>(rng.Below(256));
        break;
      case 2: {  // Insert a byte, often a structural one.
        static constexpr char kStructural[] = "()[]{}%\",=:#\\\n -.";
        data.insert(rng.Below(n + 1), 1,
                    rng.Below(2)
                        ? kStructural[rng.Below(sizeof(kStructural) - 1)]
                        : static_cast<char>(rng.Below(256)));
        break;
      }
      case 3:  // Delete a range.
        if (n > 0) {
          size_t at = rng.Below(n);
          data.erase(at, 1 + rng.Below(std::min<size_t>(n - at, 16)));
        }
        break;
      case 4:  // Duplicate a range in place.
        if (n > 0) {
          size_t at = rng.Below(n);
          size_t len = 1 + rng.Below(std::min<size_t>(n - at, 64));
          data.insert(rng.Below(n + 1), data.substr(at, len));
        }
        break;
      case 5: {  // Splice in a piece of another seed.
        const std::string& other = seeds[rng.Below(seeds.size())].data;
        if (!other.empty()) {
          size_t at = rng.Below(other.size());
          size_t len = 1 + rng.Below(std::min<size_t>(other.size() - at, 128));
          data.insert(rng.Below(n + 1), other.substr(at, len));
        }
        break;
      }
      case 6:  // Truncate.
        if (n > 0) data.resize(rng.Below(n));
        break;
      case 7:  // Insert a dictionary token.
        data.insert(rng.Below(n + 1), dict[rng.Below(dict.size())]);
        break;
    }
  }
  if (data.size() > max_len) data.resize(max_len);
  return data;
}

void Run(const std::string& input, const std::string& label) {
  g_current = &input;
  g_current_label = label;
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()),
                         input.size());
  g_current = nullptr;
}

bool ParseFlag(const char* arg, const char* name, std::string* value) {
  size_t len = std::strlen(name);
  if (std::strncmp(arg, name, len) != 0 || arg[len] != '=') return false;
  *value = arg + len + 1;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t iterations = 5000;
  uint64_t seed = 1;
  size_t max_len = 65536;
  std::vector<std::string> dict;
  std::vector<Seed> seeds;
  for (int i = 1; i < argc; ++i) {
    std::string value;
    if (ParseFlag(argv[i], "--iterations", &value)) {
      iterations = std::strtoull(value.c_str(), nullptr, 10);
    } else if (ParseFlag(argv[i], "--seed", &value)) {
      seed = std::strtoull(value.c_str(), nullptr, 10);
    } else if (ParseFlag(argv[i], "--max_len", &value)) {
      max_len = std::strtoull(value.c_str(), nullptr, 10);
    } else if (ParseFlag(argv[i], "--dict", &value)) {
      dict = ReadDictionary(value);
    } else if (argv[i][0] == '-' && argv[i][1] == '-') {
      std::fprintf(stderr, "fuzz_driver: unknown flag %s\n", argv[i]);
      return 2;
    } else {
      CollectSeeds(argv[i], &seeds);
    }
  }
  if (seeds.empty()) {
    std::fprintf(stderr,
                 "usage: %s [--iterations=N] [--seed=N] [--max_len=N] "
                 "[--dict=FILE] CORPUS_FILE_OR_DIR...\n",
                 argv[0]);
    return 2;
  }
  const char* out_dir = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  g_crash_path =
      std::string(out_dir != nullptr ? out_dir : ".") + "/fuzz_crash_input";
  for (int sig : {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) {
    signal(sig, OnCrash);
  }

  for (const Seed& s : seeds) Run(s.data, "seed " + s.name);
  Rng rng(seed);
  for (uint64_t i = 0; i < iterations; ++i) {
    const Seed& base = seeds[rng.Below(seeds.size())];
    std::string input = Mutate(seeds, dict, max_len, rng, base.data);
    Run(input, "mutation " + std::to_string(i) + " of " + base.name);
  }
  std::printf("fuzz_driver: %zu seeds and %llu mutations ran cleanly\n",
              seeds.size(), static_cast<unsigned long long>(iterations));
  return 0;
}
