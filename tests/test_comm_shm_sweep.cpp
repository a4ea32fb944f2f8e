// MpiComm's shared-memory segments after a crash (comm/mpi/shared_memory.hpp): a rank
// killed between creating its segment and unlinking it leaves the name in /dev/shm; the
// next create() on the node removes every commpact segment whose creator is gone, and
// nothing else. MPI-free: the segments' local operations only. It makes commpact names of
// its own, so it never runs beside the MPI test that counts them:
// commpact-lock: dev-shm
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdio>
#include <string>

#include "commpact/comm/mpi/shared_memory.hpp"

namespace {

using commpact::detail::mpi_shared_segments;
using commpact::detail::mpi_shm_sweep;
using commpact::detail::mpi_shm_trailer;

bool exists(const std::string& name) {
  const int fd = ::shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

//! A segment `name` of `bytes` (0: none) whose trailer holds `pid` (when bytes holds one).
void make_segment(const std::string& name, std::size_t bytes, std::int64_t pid) {
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  REQUIRE(fd >= 0);
  if (bytes > 0) {
    REQUIRE(::ftruncate(fd, static_cast<off_t>(bytes)) == 0);
    if (bytes >= mpi_shm_trailer)
      REQUIRE(::pwrite(fd, &pid, sizeof pid, static_cast<off_t>(bytes - mpi_shm_trailer)) ==
              static_cast<ssize_t>(sizeof pid));
  }
  ::close(fd);
}

//! The pid of a process that has exited and been reaped.
pid_t dead_pid() {
  const pid_t c = ::fork();
  REQUIRE(c >= 0);
  if (c == 0) ::_exit(0);
  int st = 0;
  REQUIRE(::waitpid(c, &st, 0) == c);
  return c;
}

std::string unique(const char* what) {
  return "/commpact-sweeptest-" + std::to_string(::getpid()) + "-" + what;
}

}  // namespace

TEST_CASE("the sweep removes commpact segments whose creator is gone, and only those", "[mpi][shm]") {
  const pid_t gone = dead_pid();
  const std::string stale = unique("stale"), live = unique("live"), making = unique("making"),
                    unwritten = unique("unwritten"), foreign = "/sweeptest-foreign-" + std::to_string(::getpid());
  make_segment(stale, 3 * mpi_shm_trailer, gone);
  make_segment(live, 3 * mpi_shm_trailer, ::getpid());
  make_segment(making, 0, 0);                         // created, not yet sized
  make_segment(unwritten, 3 * mpi_shm_trailer, 0);    // sized, pid not yet written
  make_segment(foreign, 3 * mpi_shm_trailer, gone);   // not commpact's
  const int removed = mpi_shm_sweep();
  CHECK(removed >= 1);
  CHECK_FALSE(exists(stale));
  CHECK(exists(live));
  CHECK(exists(making));
  CHECK(exists(unwritten));
  CHECK(exists(foreign));
  for (const auto& n : {stale, live, making, unwritten, foreign}) ::shm_unlink(n.c_str());
}

TEST_CASE("a rank killed during setup leaves its segment; the next create() on the node removes it", "[mpi][shm]") {
  // The segment name the code builds: /commpact-<nonce, 16 hex>-<rank>-<gen>.
  const std::uint64_t nonce = 0x5eed000000000000ull | static_cast<std::uint64_t>(::getpid());
  char name[80];
  std::snprintf(name, sizeof name, "/commpact-%016llx-%d-%u", static_cast<unsigned long long>(nonce), 1, 0u);
  const pid_t c = ::fork();
  REQUIRE(c >= 0);
  if (c == 0) {  // rank 1: creates its segment, then dies before any unlink
    mpi_shared_segments s;
    const bool made = s.create(nonce, 1, 0, commpact::detail::mpi_shm_min_half).empty();
    ::_exit(made ? 0 : 3);  // no destructor, no unlink: as a SIGKILL would leave it
  }
  int st = 0;
  REQUIRE(::waitpid(c, &st, 0) == c);
  REQUIRE(WIFEXITED(st));
  REQUIRE(WEXITSTATUS(st) == 0);
  REQUIRE(exists(name));  // left behind
  {
    mpi_shared_segments s;  // the next job's rank 0 on this node
    REQUIRE(s.create(nonce + 1, 0, 0, commpact::detail::mpi_shm_min_half).empty());
    CHECK_FALSE(exists(name));
    // Its own new segment records its creator, so a crash now would be swept in turn.
    char own[80];
    std::snprintf(own, sizeof own, "/commpact-%016llx-%d-%u", static_cast<unsigned long long>(nonce + 1), 0, 0u);
    const int fd = ::shm_open(own, O_RDONLY, 0);
    REQUIRE(fd >= 0);
    struct stat sb {};
    REQUIRE(::fstat(fd, &sb) == 0);
    std::int64_t pid = 0;
    REQUIRE(::pread(fd, &pid, sizeof pid, sb.st_size - static_cast<off_t>(mpi_shm_trailer)) ==
            static_cast<ssize_t>(sizeof pid));
    ::close(fd);
    CHECK(pid == ::getpid());
    CHECK(static_cast<std::size_t>(sb.st_size) == 2 * commpact::detail::mpi_shm_min_half + mpi_shm_trailer);
    s.release();  // drops the pending segment and its name
    CHECK_FALSE(exists(own));
  }
  ::shm_unlink(name);
}
