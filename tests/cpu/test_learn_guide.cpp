// The guide (docs/learn/) cannot drift from the tools: every ```console block that starts with `$ fa4 ...` must
// be exactly what that command prints now (scripts/learn-refresh rewrites them), and every file a page links
// to (figures, results) must exist.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

namespace {

namespace fs = std::filesystem;

std::string read(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The command's stdout with each line's trailing spaces and the final newlines removed (as the pages keep it).
std::string run(const std::string& args) {
  FILE* p = popen((std::string(FA4_CLI_PATH) + " " + args + " 2>/dev/null").c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while (p && (n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  if (p) pclose(p);
  std::stringstream in(out), norm;
  std::string line, pending;
  while (std::getline(in, line)) {
    line.erase(line.find_last_not_of(' ') + 1);
    pending += line + "\n";
    if (!line.empty()) norm << pending, pending.clear();
  }
  return norm.str();
}

std::vector<fs::path> pages() {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(fs::path(FA4_SOURCE_DIR) / "docs" / "learn"))
    if (e.path().extension() == ".md") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST(LearnGuide, ConsoleBlocksAreTheToolsOutput) {
  const std::regex block("```console\\n\\$ fa4 ([^\\n]*)\\n([\\s\\S]*?)```");
  int blocks = 0;
  for (const fs::path& page : pages()) {
    const std::string text = read(page);
    for (std::sregex_iterator it(text.begin(), text.end(), block), end; it != end; ++it) {
      ++blocks;
      EXPECT_EQ((*it)[2].str(), run((*it)[1].str()))
          << page.filename() << ": `fa4 " << (*it)[1] << "` prints something else now; run scripts/learn-refresh";
    }
  }
  EXPECT_GE(blocks, 4) << "the guide lost its command blocks";
}

TEST(LearnGuide, LinkedFilesExist) {
  const std::regex link("\\]\\(([^)#]+)\\)");
  int links = 0;
  for (const fs::path& page : pages()) {
    const std::string text = read(page);
    for (std::sregex_iterator it(text.begin(), text.end(), link), end; it != end; ++it) {
      const std::string target = (*it)[1];
      if (target.rfind("http", 0) == 0) continue;
      ++links;
      EXPECT_TRUE(fs::exists(page.parent_path() / target)) << page.filename() << " links to a missing " << target;
    }
  }
  EXPECT_GE(links, 5);
}
