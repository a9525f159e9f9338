// Regular-file inputs and staged, renamed-into-place outputs (src/io/files.hpp). POSIX calls:
// open(O_NONBLOCK) + fstat decide what a path is without blocking on a FIFO, mkstemp + rename
// replace a file atomically within its folder.
#include "io/files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "blasst/blasst.hpp"
#include "core/text.hpp"

namespace blasst::io {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void fail_at(const std::string& label, const std::string& path, const std::string& what) {
  const std::string file = path.empty() ? std::string("''") : detail::printable(path, 300);
  throw Error((label.empty() ? "" : label + ": ") + file + ": " + what);
}

std::string errno_text(int e) { return std::strerror(e); }

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

// Permission bits for a new file: what open(O_CREAT, 0666) would give under the process umask.
mode_t new_file_mode() {
  // /proc/self/status has the umask without changing it (umask() itself is a set, not a get).
  std::ifstream st("/proc/self/status");
  std::string line;
  while (std::getline(st, line))
    if (line.rfind("Umask:", 0) == 0) return static_cast<mode_t>(0666 & ~std::stoul(line.substr(6), nullptr, 8));
  const mode_t m = ::umask(022);
  ::umask(m);
  return static_cast<mode_t>(0666 & ~m);
}

bool write_all(int fd, const unsigned char* p, std::size_t n, int& err) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      err = errno;
      return false;
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

}  // namespace

// ---- inputs ------------------------------------------------------------------------------------

InputFile::InputFile(const std::string& path, const std::string& label) : path_(path), label_(label) {
  if (path.empty()) fail("empty path");
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused just below.
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd_ < 0) fail("cannot open for reading: " + errno_text(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int e = errno;
    ::close(fd_);
    fd_ = -1;
    fail("cannot stat: " + errno_text(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    fail(std::string("is ") + kind_of(st.st_mode) + "; inputs must be regular files");
  }
  size_ = static_cast<std::uint64_t>(st.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void InputFile::fail(const std::string& what) const { fail_at(label_, path_, what); }

void InputFile::read_at(std::uint64_t offset, void* dst, std::size_t n) const {
  auto* p = static_cast<unsigned char*>(dst);
  while (n > 0) {
    const ssize_t r = ::pread(fd_, p, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      fail("read error: " + errno_text(errno));
    }
    if (r == 0) fail("read error: the file ended early (changed while reading?)");
    p += r;
    n -= static_cast<std::size_t>(r);
    offset += static_cast<std::uint64_t>(r);
  }
}

std::string read_file(const std::string& path, std::uint64_t max_bytes, const std::string& label) {
  const InputFile f(path, label);
  if (f.size() > max_bytes)
    f.fail("too large (" + std::to_string(f.size()) + " bytes; the limit is " + std::to_string(max_bytes) +
           " bytes)");
  std::string text(static_cast<std::size_t>(f.size()), '\0');
  f.read_at(0, text.data(), text.size());
  return text;
}

// ---- outputs -----------------------------------------------------------------------------------

OutputFile::OutputFile(const std::string& path, const std::string& label) : path_(path), label_(label) {
  if (path.empty()) fail("empty path");
  std::error_code ec;
  // Replace what a symlink points to, not the link (writing through it did the same before).
  const fs::path resolved = fs::weakly_canonical(fs::path(path), ec);
  target_ = ec ? path : resolved.string();
  struct stat st {};
  if (::stat(target_.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) fail("is a directory");
    if (S_ISBLK(st.st_mode)) fail("is a block device; refusing to write to it");
    // Devices and pipes (/dev/null, a terminal, /dev/stdout into a pipe) cannot be replaced
    // atomically; they are written in place at commit().
    device_ = !S_ISREG(st.st_mode);
  }
  if (!device_) {
    fs::path dir = fs::path(target_).parent_path();
    if (dir.empty()) dir = ".";
    struct stat ds {};
    if (::stat(dir.c_str(), &ds) != 0 || !S_ISDIR(ds.st_mode))
      fail("cannot write: the folder " + detail::single_quoted(dir.string(), 300) + " does not exist");
    if (::access(dir.c_str(), W_OK) != 0)
      fail("cannot write: the folder " + detail::single_quoted(dir.string(), 300) + " is not writable (" +
           errno_text(errno) + ")");
  }
}

OutputFile::OutputFile(OutputFile&& o) noexcept
    : path_(std::move(o.path_)), label_(std::move(o.label_)), target_(std::move(o.target_)),
      device_(o.device_), tmp_(std::move(o.tmp_)), held_(std::move(o.held_)), staged_(o.staged_) {
  o.tmp_.clear();
  o.staged_ = false;
}

OutputFile::~OutputFile() { discard(); }

void OutputFile::discard() noexcept {
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
  tmp_.clear();
}

void OutputFile::fail(const std::string& what) const { fail_at(label_, path_, what); }

void OutputFile::stage(const void* data, std::size_t n) {
  discard();
  staged_ = false;
  const auto* bytes = static_cast<const unsigned char*>(data);
  if (device_) {
    held_.assign(bytes, bytes + n);
    staged_ = true;
    return;
  }
  const fs::path t(target_);
  fs::path dir = t.parent_path();
  if (dir.empty()) dir = ".";
  // A hidden name next to the target (same filesystem: rename is atomic); a shorter one when
  // the target's name is already near NAME_MAX.
  std::string hidden(1, '.');
  hidden += t.filename().string();
  hidden += ".blasst-XXXXXX";
  std::string tmpl = (dir / hidden).string();
  int fd = ::mkstemp(tmpl.data());
  if (fd < 0 && errno == ENAMETOOLONG) {
    tmpl = (dir / ".blasst-XXXXXX").string();
    fd = ::mkstemp(tmpl.data());
  }
  if (fd < 0) fail("cannot create a temporary file next to it: " + errno_text(errno));
  tmp_ = tmpl;
  struct stat st {};
  const mode_t mode = ::stat(target_.c_str(), &st) == 0 && S_ISREG(st.st_mode)
                          ? static_cast<mode_t>(st.st_mode & 07777)
                          : new_file_mode();
  (void)::fchmod(fd, mode);  // best effort (mkstemp made it 0600): the content matters more
  int err = 0;
  bool ok = write_all(fd, bytes, n, err);
  // fsync before the rename: after a crash the target is the old file or the complete new one.
  if (ok && ::fsync(fd) != 0 && errno != EINVAL && errno != EROFS) {
    err = errno;
    ok = false;
  }
  if (::close(fd) != 0 && ok) {
    err = errno;
    ok = false;
  }
  if (!ok) {
    discard();
    fail("write error: " + errno_text(err) + " (the previous file, if any, is unchanged)");
  }
  staged_ = true;
}

void OutputFile::commit() {
  if (!staged_) fail("internal: commit() before stage()");
  if (device_) {
    const int fd = ::open(target_.c_str(), O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
      fail(errno == ENXIO ? std::string("cannot open for writing: a FIFO without a reader")
                          : "cannot open for writing: " + errno_text(errno));
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    int err = 0;
    const bool ok = write_all(fd, held_.data(), held_.size(), err);
    ::close(fd);
    if (!ok) fail("write error: " + errno_text(err));
    held_.clear();
    staged_ = false;
    return;
  }
  if (::rename(tmp_.c_str(), target_.c_str()) != 0) {
    const int e = errno;
    discard();
    fail("cannot replace the file: " + errno_text(e));
  }
  tmp_.clear();
  staged_ = false;
}

void commit_all(const std::vector<OutputFile*>& outputs) {
  for (OutputFile* o : outputs)
    if (o->is_device()) o->commit();
  for (OutputFile* o : outputs)
    if (!o->is_device()) o->commit();
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  const bool ea = ::stat(a.c_str(), &sa) == 0, eb = ::stat(b.c_str(), &sb) == 0;
  if (ea && eb) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  if (ea != eb) return false;
  std::error_code e1, e2;
  const fs::path ca = fs::weakly_canonical(fs::path(a), e1), cb = fs::weakly_canonical(fs::path(b), e2);
  if (e1 || e2) return fs::path(a).lexically_normal() == fs::path(b).lexically_normal();
  return ca == cb;
}

}  // namespace blasst::io
