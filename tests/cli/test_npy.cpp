// .npy reader/writer: round trips for every element type, byte-exact numpy layout, and refusal of
// corrupted files (each error must name the file).
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "blasst/half.hpp"
#include "blasst/npy.hpp"

namespace fs = std::filesystem;
using blasst::Error;
namespace npy = blasst::npy;

namespace {

class NpyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("blasst_npy_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_" +
            std::to_string(std::random_device{}()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& n) const { return (dir_ / n).string(); }

  void write_bytes(const std::string& p, const std::vector<unsigned char>& b) {
    std::ofstream f(p, std::ios::binary);
    f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  }
  // A version-1.0 file with the given dict text (padded like numpy) and payload.
  std::vector<unsigned char> v1_file(std::string dict, std::size_t payload, int major = 1) {
    const std::size_t prefix = major == 1 ? 10 : 12;
    const std::size_t total = prefix + dict.size() + 1;
    dict.append((64 - total % 64) % 64, ' ');
    dict.push_back('\n');
    std::vector<unsigned char> out = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<unsigned char>(major), 0};
    const std::size_t hl = dict.size();
    out.push_back(hl & 0xff);
    out.push_back((hl >> 8) & 0xff);
    if (major > 1) {
      out.push_back((hl >> 16) & 0xff);
      out.push_back((hl >> 24) & 0xff);
    }
    out.insert(out.end(), dict.begin(), dict.end());
    for (std::size_t i = 0; i < payload; ++i) out.push_back(static_cast<unsigned char>(i * 7 + 1));
    return out;
  }
  // Expect read() to throw an Error whose message names the file and contains `needle`.
  void expect_reject(const std::vector<unsigned char>& bytes, const std::string& needle,
                     std::uint64_t max_bytes = npy::kMaxBytes) {
    const std::string p = path("bad.npy");
    write_bytes(p, bytes);
    try {
      npy::read(p, max_bytes);
      FAIL() << "accepted a bad file (expected: " << needle << ")";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(p), std::string::npos) << m;
      EXPECT_NE(m.find(needle), std::string::npos) << m;
    }
    // The in-memory parser must agree.
    EXPECT_THROW(npy::parse(bytes.data(), bytes.size(), "mem", max_bytes), Error);
  }

  fs::path dir_;
};

TEST_F(NpyTest, RoundTripF32) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  std::vector<float> x(2 * 5 * 3 * 7);
  for (auto& v : x) v = nd(rng);
  npy::write(path("a.npy"), npy::from_f32(x.data(), {2, 5, 3, 7}));
  const npy::Array a = npy::read(path("a.npy"));
  EXPECT_EQ(a.elem, npy::Elem::f32);
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2, 5, 3, 7}));
  ASSERT_EQ(a.numel(), static_cast<std::int64_t>(x.size()));
  EXPECT_EQ(0, std::memcmp(a.f32(), x.data(), x.size() * 4));
  const std::vector<float> w = npy::to_f32(a, npy::library_dtype(a, false, "a"));
  EXPECT_EQ(w, x);
}

TEST_F(NpyTest, RoundTripF64ScalarAndEmpty) {
  const double x[3] = {1.5, -2.25, 1e300};
  npy::write(path("d.npy"), npy::from_f64(x, {3}));
  npy::Array a = npy::read(path("d.npy"));
  EXPECT_EQ(a.elem, npy::Elem::f64);
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{3}));
  EXPECT_EQ(a.f64()[2], 1e300);
  EXPECT_EQ(npy::library_dtype(a, false, "d"), blasst::DType::f64);

  npy::write(path("s.npy"), npy::from_f64(x, {}));  // scalar: shape ()
  a = npy::read(path("s.npy"));
  EXPECT_TRUE(a.shape.empty());
  EXPECT_EQ(a.numel(), 1);
  EXPECT_EQ(a.f64()[0], 1.5);

  npy::write(path("e.npy"), npy::from_f32(nullptr, {4, 0, 2}));
  a = npy::read(path("e.npy"));
  EXPECT_EQ(a.numel(), 0);
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{4, 0, 2}));
}

TEST_F(NpyTest, RoundTripSixteenBitTypes) {
  const std::vector<float> vals = {0.0f, 1.0f, -2.5f, 0.333333f, 65504.0f, 6.1e-5f};
  std::vector<std::uint16_t> h, b;
  for (float v : vals) {
    h.push_back(blasst::float_to_f16(v));
    b.push_back(blasst::float_to_bf16(v));
  }
  npy::write(path("h.npy"), npy::from_u16(h.data(), {2, 3}, npy::Elem::f16));
  npy::write(path("u.npy"), npy::from_u16(b.data(), {2, 3}, npy::Elem::u16));
  npy::write(path("v.npy"), npy::from_u16(b.data(), {3, 2}, npy::Elem::bf16));

  npy::Array a = npy::read(path("h.npy"));
  EXPECT_EQ(a.elem, npy::Elem::f16);
  EXPECT_EQ(npy::library_dtype(a, false, "h"), blasst::DType::f16);
  std::vector<float> w = npy::to_f32(a, blasst::DType::f16);
  for (std::size_t i = 0; i < vals.size(); ++i) EXPECT_NEAR(w[i], vals[i], std::abs(vals[i]) * 1e-3 + 1e-7);

  a = npy::read(path("u.npy"));
  EXPECT_EQ(a.elem, npy::Elem::u16);
  EXPECT_THROW(npy::library_dtype(a, false, "u.npy"), Error);  // integers need --dtype bf16
  EXPECT_EQ(npy::library_dtype(a, true, "u.npy"), blasst::DType::bf16);
  w = npy::to_f32(a, blasst::DType::bf16);
  for (std::size_t i = 0; i < vals.size(); ++i) EXPECT_NEAR(w[i], vals[i], std::abs(vals[i]) * 8e-3 + 1e-7);

  a = npy::read(path("v.npy"));
  EXPECT_EQ(a.elem, npy::Elem::bf16);
  EXPECT_EQ(npy::library_dtype(a, false, "v"), blasst::DType::bf16);
  EXPECT_EQ(0, std::memcmp(a.u16(), b.data(), b.size() * 2));
}

// The writer's bytes must be what numpy itself writes for np.save(np.arange(6, dtype='<f4')
// .reshape(2, 3)): 64-byte aligned header, version 1.0, trailing newline.
TEST_F(NpyTest, ByteExactNumpyLayout) {
  const float x[6] = {0, 1, 2, 3, 4, 5};
  const std::vector<unsigned char> img = npy::serialize(npy::from_f32(x, {2, 3}));
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  ASSERT_EQ(img.size(), 128u + 24u);
  EXPECT_EQ(0, std::memcmp(img.data(), "\x93NUMPY\x01\x00\x76\x00", 10));  // 118-byte header
  EXPECT_EQ(std::string(img.begin() + 10, img.begin() + 10 + dict.size()), dict);
  EXPECT_EQ(img[127], '\n');
  for (std::size_t i = 10 + dict.size(); i < 127; ++i) EXPECT_EQ(img[i], ' ');
  EXPECT_EQ(0, std::memcmp(img.data() + 128, x, 24));
  // One-element shapes get Python's trailing comma.
  const std::vector<unsigned char> one = npy::serialize(npy::from_f32(x, {6}));
  EXPECT_NE(std::string(one.begin(), one.end()).find("'shape': (6,)"), std::string::npos);
}

TEST_F(NpyTest, ReadsVersions2And3AndDoubleQuotes) {
  for (int major : {2, 3}) {
    const auto img = v1_file("{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2,)}", 8, major);
    write_bytes(path("v.npy"), img);
    const npy::Array a = npy::read(path("v.npy"));
    EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2}));
    EXPECT_EQ(a.bytes.size(), 8u);
    EXPECT_EQ(a.bytes[0], 1);
  }
  // Key order does not matter; ml_dtypes' bfloat16 may be spelt '<V2'.
  write_bytes(path("w.npy"), v1_file("{'shape': (3, 1), 'fortran_order': False, 'descr': '<V2'}", 6));
  EXPECT_EQ(npy::read(path("w.npy")).elem, npy::Elem::bf16);
}

TEST_F(NpyTest, RejectsTruncatedFiles) {
  const float x[6] = {0, 1, 2, 3, 4, 5};
  std::vector<unsigned char> img = npy::serialize(npy::from_f32(x, {2, 3}));
  auto cut = img;
  cut.pop_back();
  expect_reject(cut, "truncated");
  cut.resize(60);  // inside the header dict
  expect_reject(cut, "truncated");
  cut.resize(8);  // inside the prefix
  expect_reject(cut, "bad magic");
  expect_reject({}, "bad magic");
}

TEST_F(NpyTest, RejectsMalformedHeaders) {
  auto img = v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 8);
  img[1] = 'X';
  expect_reject(img, "bad magic");
  img = v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 8);
  img[6] = 4;
  expect_reject(img, "version");
  expect_reject(v1_file("{'descr': '<f4', 'shape': (2,), }", 8), "fortran_order");
  expect_reject(v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", 8), "unexpected key");
  expect_reject(v1_file("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,)}", 8), "True or False");
  expect_reject(v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,-1)}", 8), "non-negative");
  expect_reject(v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2)}", 8), "trailing comma");
  expect_reject(v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} junk", 8), "after the header");
  expect_reject(v1_file("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", 8), "duplicate");
  expect_reject(v1_file("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}", 8), "structured");
  expect_reject(v1_file("{'descr': '<i4', 'fortran_order': False, 'shape': (2,)}", 8), "unsupported dtype");
  expect_reject(v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,", 8), "header");
  // Payload longer than the shape says.
  expect_reject(v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", 12), "shape/size mismatch");
  // Header longer than numpy's own limit.
  expect_reject(v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)}" + std::string(20000, ' '), 8, 2),
                "header too long");
}

TEST_F(NpyTest, RejectsFortranAndBigEndian) {
  expect_reject(v1_file("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2)}", 16), "fortran_order is True");
  expect_reject(v1_file("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 2)}", 16), "big-endian");
  expect_reject(v1_file("{'descr': '>f2', 'fortran_order': False, 'shape': (2,)}", 4), "big-endian");
}

TEST_F(NpyTest, RejectsOversized) {
  // Product overflow of the shape.
  expect_reject(v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 16)}", 0),
                "overflows");
  expect_reject(v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}", 0),
                "overflows");
  // Empty (a zero dimension), but the nonzero dimensions' product overflows int64: every later
  // product of the shape would be undefined behaviour (FuzzSanitized's find, UBSan in numel).
  expect_reject(v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (3709551615, 4290967296, 0)}", 0),
                "overflows");
  // Empty with a large but representable product is still an empty array.
  {
    const std::string p = path("big_empty.npy");
    write_bytes(p, v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (3000000000, 3000000000, 0)}", 0));
    EXPECT_EQ(npy::read(p).numel(), 0);
  }
  // More than the 16 GiB default limit: refused before anything is allocated.
  expect_reject(v1_file("{'descr': '<f8', 'fortran_order': False, 'shape': (65536, 65536)}", 0), "too large");
  // A caller-chosen smaller limit.
  expect_reject(v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (100,)}", 400), "too large", 399);
  // A lying header that claims more data than the file holds.
  expect_reject(v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000,)}", 16), "truncated");
}

TEST_F(NpyTest, MissingFileAndBadWrites) {
  try {
    npy::read(path("nope.npy"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nope.npy"), std::string::npos);
  }
  npy::Array bad = npy::from_f32(nullptr, {0});
  bad.shape = {3};  // 0 bytes for 3 elements
  EXPECT_THROW(npy::serialize(bad), Error);
  const float x = 1;
  EXPECT_THROW(npy::write((dir_ / "no_such_dir" / "x.npy").string(), npy::from_f32(&x, {1})), Error);
}

// ---- issue 21 ----------------------------------------------------------------------------------

// Inputs must be regular files: a FIFO (which used to block the reader forever), a device and a
// directory are refused at once, by name.
TEST_F(NpyTest, NonRegularInputsAreRefused) {
  const std::string fifo = path("q.npy");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& [p, what] : {std::pair<std::string, std::string>{fifo, "is a FIFO"},
                                {"/dev/zero", "is a character device"},
                                {dir_.string(), "is a directory"}}) {
    try {
      npy::read(p);
      FAIL() << p;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(p + ": " + what + "; inputs must be regular files"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
}

// A write that fails part-way (here a file-size limit, as on a full disk) leaves the previous
// file whole and loadable, and no temporary behind. The old writer truncated it in place.
TEST_F(NpyTest, FailedWriteKeepsThePreviousFile) {
  const std::string p = path("o.npy");
  const float old_values[4] = {1, 2, 3, 4};
  npy::write(p, npy::from_f32(old_values, {4}));
  const std::vector<float> big(1 << 16, 7.0f);  // 256 KiB, over the limit below
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::signal(SIGXFSZ, SIG_IGN);  // as the CLI does: EFBIG instead of a kill
    const rlimit lim{64 * 1024, 64 * 1024};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(10);
    try {
      npy::write(p, npy::from_f32(big.data(), {static_cast<std::int64_t>(big.size())}));
    } catch (const Error& e) {
      const std::string m = e.what();
      ::_exit(m.find(p + ": write error") != std::string::npos ? 0 : 11);
    }
    ::_exit(12);  // the write succeeded: the limit did not bite
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0) << "10: setrlimit, 11: message, 12: no failure";
  const npy::Array back = npy::read(p);
  ASSERT_EQ(back.shape, (std::vector<std::int64_t>{4}));
  EXPECT_EQ(std::memcmp(back.f32(), old_values, sizeof old_values), 0);
  std::size_t entries = 0;
  for (const auto& e : fs::directory_iterator(dir_)) entries += e.exists() ? 1 : 0;
  EXPECT_EQ(entries, 1u) << "a temporary was left behind";
}

// The replaced file keeps its permissions; a new one gets the umask's; a symlinked target is
// replaced where the link points; /dev/null is written in place.
TEST_F(NpyTest, ReplacementKeepsModeAndFollowsLinks) {
  const float x[2] = {5, 6};
  const std::string p = path("o.npy");
  npy::write(p, npy::from_f32(x, {2}));
  ASSERT_EQ(::chmod(p.c_str(), 0640), 0);
  npy::write(p, npy::from_f32(x, {1}));
  struct stat st {};
  ASSERT_EQ(::stat(p.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  fs::create_symlink(p, path("link.npy"));
  npy::write(path("link.npy"), npy::from_f32(x, {2}));
  EXPECT_TRUE(fs::is_symlink(path("link.npy")));
  EXPECT_EQ(npy::read(p).shape, (std::vector<std::int64_t>{2}));
  EXPECT_NO_THROW(npy::write("/dev/null", npy::from_f32(x, {2})));
  EXPECT_THROW(npy::write(dir_.string(), npy::from_f32(x, {2})), Error);  // a directory
  EXPECT_THROW(npy::write("", npy::from_f32(x, {2})), Error);
}

// A NUL (or any control byte) in the header no longer cuts or splits the message.
TEST_F(NpyTest, HeaderBytesAreEchoedPrintably) {
  std::string dict = "{'descr': '<f";
  dict += '\0';
  dict += "\x1b', 'fortran_order': False, 'shape': (1,)}";
  try {
    npy::parse(v1_file(dict, 4).data(), v1_file(dict, 4).size(), "x.npy");
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("unsupported dtype '<f\\x00\\x1b' (supported:"), std::string::npos) << m;
    for (unsigned char c : m) EXPECT_GE(c, 0x20);
  }
}

// Random byte flips of a valid file never crash: each parse either succeeds or throws Error.
TEST_F(NpyTest, RandomCorruptionNeverCrashes) {
  const float x[12] = {};
  const auto good = npy::serialize(npy::from_f32(x, {3, 4}));
  std::mt19937 rng(5);
  for (int it = 0; it < 3000; ++it) {
    auto b = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) b[rng() % 128] = static_cast<unsigned char>(rng());
    if (rng() % 4 == 0) b.resize(rng() % b.size());
    try {
      const npy::Array a = npy::parse(b.data(), b.size(), "fuzz");
      EXPECT_EQ(a.bytes.size(), static_cast<std::size_t>(a.numel()) * npy::elem_size(a.elem));
    } catch (const Error&) {
    }
  }
}

}  // namespace
