// replace_file: the old text or the new, and never a write through a planted link.
#include "common/atomic_file.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace nvshare {
namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class AtomicFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nvshare-atomic-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(AtomicFileTest, ReplacesTheFileWithTheModeAsked) {
  const std::string path = dir_ + "/state.json";
  ASSERT_TRUE(replace_file(path, "one", 0600).ok());
  ASSERT_TRUE(replace_file(path, "two", 0600).ok());
  EXPECT_EQ(read_all(path), "two");
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

// Someone who can write the directory plants <path>.tmp as a link to a file of their choosing (or
// of the scheduler's): the write goes to the state file, and the link's target is untouched.
TEST_F(AtomicFileTest, APlantedLinkAtTheTemporaryRedirectsNothing) {
  const std::string path = dir_ + "/state.json";
  const std::string victim = dir_ + "/victim";
  std::ofstream(victim) << "precious";
  std::filesystem::create_symlink(victim, path + ".tmp");
  ASSERT_TRUE(replace_file(path, "limits", 0600).ok());
  EXPECT_EQ(read_all(path), "limits");
  EXPECT_EQ(read_all(victim), "precious");
  EXPECT_FALSE(std::filesystem::is_symlink(path));
  // A stale temporary of a crashed writer is replaced too.
  std::ofstream(path + ".tmp") << "stale";
  ASSERT_TRUE(replace_file(path, "again", 0600).ok());
  EXPECT_EQ(read_all(path), "again");
}

}  // namespace
}  // namespace nvshare
