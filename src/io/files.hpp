// Internal: how blasst reads its input files and replaces its output files (issue 21).
// - Inputs must be regular files: a FIFO, a device or a directory is refused by name before a
//   read could block or run forever, and a size limit is checked before anything is allocated.
// - Outputs are written to a temporary file in the target's folder and renamed over the target
//   only when complete, so a failing run (disk full, a file-size limit, an error in another
//   output) never leaves a truncated file and never destroys the previous good one. A
//   character device (/dev/null, a terminal) or a pipe with a reader is written in place.
// Messages name the file ("o.npy: ...") and, when a label is given (the CLI's flag), start with
// it ("--out: o.npy: ...").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace blasst::io {

// An open regular file for reading (refuses anything else). Reads are bounded by size().
class InputFile {
 public:
  InputFile(const std::string& path, const std::string& label = "");
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  std::uint64_t size() const { return size_; }
  // Reads exactly n bytes at offset; throws Error when the file ends earlier (it changed).
  void read_at(std::uint64_t offset, void* dst, std::size_t n) const;
  [[noreturn]] void fail(const std::string& what) const;

 private:
  std::string path_, label_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

// The whole content of a regular file of at most max_bytes bytes.
std::string read_file(const std::string& path, std::uint64_t max_bytes, const std::string& label = "");

// One output file. The constructor checks, without creating anything, that the target can be
// replaced: a non-empty path, an existing writable folder, not a directory. stage() writes the
// content to a temporary next to the target (or keeps it for a device target); commit() renames
// it into place. Destroyed without commit(), the temporary is removed and the target untouched.
class OutputFile {
 public:
  OutputFile(const std::string& path, const std::string& label = "");
  ~OutputFile();
  OutputFile(OutputFile&& o) noexcept;
  OutputFile& operator=(OutputFile&&) = delete;
  OutputFile(const OutputFile&) = delete;

  void stage(const void* data, std::size_t n);
  void stage(const std::string& text) { stage(text.data(), text.size()); }
  void stage(const std::vector<unsigned char>& bytes) { stage(bytes.data(), bytes.size()); }
  void commit();
  const std::string& path() const { return path_; }
  bool is_device() const { return device_; }  // written in place at commit()
  [[noreturn]] void fail(const std::string& what) const;

 private:
  void discard() noexcept;

  std::string path_, label_;
  std::string target_;  // path_ with symlinks resolved: the file that gets replaced
  bool device_ = false;
  std::string tmp_;     // staged temporary ("" when none)
  std::vector<unsigned char> held_;  // device targets: the content, written at commit()
  bool staged_ = false;
};

// Commits several staged outputs as one step: device targets are written first (they can fail),
// then the temporaries are renamed. Use after every output was staged successfully.
void commit_all(const std::vector<OutputFile*>& outputs);

// True when a and b name the same file: the same inode when both exist, else the same path
// once symlinks and "." / ".." are resolved.
bool same_file(const std::string& a, const std::string& b);

}  // namespace blasst::io
