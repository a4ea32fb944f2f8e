// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file mpi/shared_memory.hpp
//! MpiComm's shared-memory path for checked allreduces and allgathers (of up to
//! mpi_options::shared_memory_max bytes per rank), when every rank of the communicator
//! runs on one node. Each rank maps a segment of
//! POSIX shared memory of its own (writable) and every peer's (read-only). A collective
//! copies this rank's data into its own segment, runs the signature check (a barrier:
//! once it passed every rank's data is in place), and then each rank copies what it
//! needs straight from the peers' segments with its own CPU:
//! - allgather: every peer's block, from its segment into `out`;
//! - allreduce: rank r stages every chunk but its own (chunk r, which only it reads),
//!   folds chunk r of every rank's data (ranks 0, 1, ..., P-1, in that order; its own
//!   straight from `data`) into chunk r of its own segment, a second check round makes
//!   sure every rank folded, then every rank copies chunk c from rank c's segment into
//!   `data`. Each element's final value is computed on one rank and copied by the
//!   others: identical bits everywhere.
//!
//! Vader without single-copy, OpenMPI's shared-memory transport here, copies every
//! message twice (into a shared FIFO, out of it), and isolated buffers need a third
//! copy (out of staging). This path copies each byte into shared memory once and out
//! once, whatever P is, and MPI never writes into user memory: `data` and `out` are
//! written only by this rank's own copies, after every check passed, so
//! `isolate_buffers`' promise holds by construction, without staging.
//!
//! Reuse: a segment holds two halves, used by alternate shared-memory collectives
//! (`parity`). A collective writes its half before its check; the half it overwrites
//! was last read two such collectives ago, and every peer finished reading it before it
//! sent its signature for the collective in between, whose check this rank passed. So
//! the path needs each such collective to complete before its call returns (it does,
//! as the held allgather does: the nonblocking forms return a completed handle), and
//! the halves advance only after a check that passed, alike on every rank.
//!
//! Setup and growth are collective and follow a check that passed (every rank calls
//! them alike): each rank creates a segment under a name built from the nonce every
//! rank agreed on at construction, reserves its memory (posix_fallocate: a full
//! /dev/shm is an error here, not a SIGBUS later), then a round of the latency path
//! agrees that every rank succeeded, each maps its peers' segments, a second round
//! agrees on that (ranks on different nodes fail to open each other's names), and each
//! unlinks its name (the mappings stay; nothing is left in /dev/shm, even after a
//! crash later). A failure on any rank leaves every rank on point-to-point for this
//! size and above (mpi_state's shm_ceiling_). Everything here is local: no call can hang.
//!
//! A rank killed during setup (between create and the unlink) leaves its name behind.
//! So a segment ends in a trailer page holding its creator's pid, and every create()
//! first removes the commpact segments in /dev/shm whose creator no longer runs
//! (kill(pid, 0) fails with ESRCH; a segment still being made, whose pid is not yet
//! written, is left alone, as is any whose creator runs or cannot be told).
//! Part of MpiComm (include commpact/comm/mpi_comm.hpp).

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace commpact::detail {

//! The smallest half a shared segment is given (growth goes by powers of two from it).
inline constexpr std::size_t mpi_shm_min_half = 1u << 20;
//! The page after a segment's two halves: its creator's pid (an int64 at its start).
inline constexpr std::size_t mpi_shm_trailer = 4096;
//! What every segment's name starts with (in /dev/shm, without the leading slash).
inline constexpr const char* mpi_shm_prefix = "commpact-";

//! Removes the commpact segments under `dir` (/dev/shm: where Linux keeps POSIX shared
//! memory) whose creator is gone: the pid in the trailer names no process (ESRCH).
//! Returns how many it removed. Local and best effort: a name it cannot open or read,
//! or whose pid is 0 (still being made) or runs, is left alone.
inline int mpi_shm_sweep(const char* dir = "/dev/shm") noexcept {
  DIR* d = ::opendir(dir);
  if (d == nullptr) return 0;
  int removed = 0;
  const std::size_t plen = std::strlen(mpi_shm_prefix);
  while (const dirent* e = ::readdir(d)) {
    if (std::strncmp(e->d_name, mpi_shm_prefix, plen) != 0) continue;
    const std::string name = std::string("/") + e->d_name;
    const int fd = ::shm_open(name.c_str(), O_RDONLY, 0);
    if (fd < 0) continue;
    struct stat st {};
    std::int64_t pid = 0;
    const bool read = ::fstat(fd, &st) == 0 && static_cast<std::size_t>(st.st_size) >= mpi_shm_trailer &&
                      ::pread(fd, &pid, sizeof pid, st.st_size - static_cast<off_t>(mpi_shm_trailer)) ==
                          static_cast<ssize_t>(sizeof pid);
    ::close(fd);
    if (!read || pid <= 0 || pid != static_cast<pid_t>(pid)) continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH && ::shm_unlink(name.c_str()) == 0) ++removed;
  }
  ::closedir(d);
  return removed;
}

//! This rank's view of every rank's shared segment: two halves of capacity() bytes each.
//! Local operations only (POSIX shm_open, posix_fallocate, mmap); mpi_state sequences
//! them collectively (see the file comment).
class mpi_shared_segments {
 public:
  mpi_shared_segments() = default;
  mpi_shared_segments(const mpi_shared_segments&) = delete;
  mpi_shared_segments& operator=(const mpi_shared_segments&) = delete;
  ~mpi_shared_segments() { release(); }

  //! True once every rank's segment is mapped here.
  bool mapped() const { return !maps_.empty(); }
  //! Bytes each half holds (0 before the first setup).
  std::size_t capacity() const { return half_; }
  //! Rank q's half for the current shared-memory collective (this rank's is writable).
  std::byte* half(int q) const { return maps_[static_cast<std::size_t>(q)] + parity_ * half_; }
  //! Moves on to the other half (after a shared-memory collective completed).
  void flip() { parity_ ^= 1; }

  //! Creates this rank's new segment of two halves of `half_bytes` each (not yet mapped
  //! for use: adopt() does that). Returns an empty string or why it failed.
  std::string create(std::uint64_t nonce, int rank, unsigned gen, std::size_t half_bytes) {
    drop_pending();
    (void)mpi_shm_sweep();
    const std::string name = name_of(nonce, rank, gen);
    const std::size_t bytes = 2 * half_bytes;
    const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) return why("shm_open", name, errno);
    pending_name_ = name;
    const char* call = "ftruncate";
    int rc = ::ftruncate(fd, static_cast<off_t>(bytes + mpi_shm_trailer)) == 0 ? 0 : errno;
    if (rc == 0) {
      call = "pwrite";
      const std::int64_t pid = ::getpid();
      if (::pwrite(fd, &pid, sizeof pid, static_cast<off_t>(bytes)) != static_cast<ssize_t>(sizeof pid))
        rc = errno != 0 ? errno : EIO;
    }
    if (rc == 0) {
      call = "posix_fallocate";
      rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes + mpi_shm_trailer));
    }
    if (rc != 0) {
      ::close(fd);
      drop_pending();
      return why(call, name, rc);
    }
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int e = errno;
    ::close(fd);
    if (p == MAP_FAILED) {
      drop_pending();
      return why("mmap", name, e);
    }
    pending_own_ = static_cast<std::byte*>(p);
    pending_rank_ = rank;
    pending_half_ = half_bytes;
    return {};
  }

  //! This rank's new segment's first half (between create() and adopt()).
  std::byte* pending_own() const { return pending_own_; }

  //! Maps peer q's new segment (read-only), after every rank's create() succeeded.
  std::string attach(std::uint64_t nonce, int q, unsigned gen) {
    const std::string name = name_of(nonce, q, gen);
    const int fd = ::shm_open(name.c_str(), O_RDONLY, 0);
    if (fd < 0) return why("shm_open", name, errno);
    struct stat st {};
    if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) < 2 * pending_half_) {
      ::close(fd);
      return why("fstat", name, EINVAL);
    }
    void* p = ::mmap(nullptr, 2 * pending_half_, PROT_READ, MAP_SHARED, fd, 0);
    const int e = errno;
    ::close(fd);
    if (p == MAP_FAILED) return why("mmap", name, e);
    peers_pending_.push_back({q, static_cast<std::byte*>(p)});
    return {};
  }

  //! Removes this rank's new segment's name (its mappings stay valid).
  void unlink_pending_name() noexcept {
    if (!pending_name_.empty()) ::shm_unlink(pending_name_.c_str());
    pending_name_.clear();
  }

  //! Switches to the new segments of P ranks (every rank mapped every peer's), releasing
  //! the old ones; the first half is current.
  void adopt(int P) {
    release_maps();
    maps_.assign(static_cast<std::size_t>(P), nullptr);
    maps_[static_cast<std::size_t>(pending_rank_)] = pending_own_;
    for (const auto& [q, p] : peers_pending_) maps_[static_cast<std::size_t>(q)] = p;
    half_ = pending_half_;
    parity_ = 0;
    pending_own_ = nullptr;
    peers_pending_.clear();
    unlink_pending_name();
  }

  //! Gives up on the new segments (some rank failed): the old ones stay in use.
  void drop_pending() noexcept {
    unlink_pending_name();
    if (pending_own_) ::munmap(pending_own_, 2 * pending_half_);
    for (const auto& pp : peers_pending_) ::munmap(pp.second, 2 * pending_half_);
    pending_own_ = nullptr;
    peers_pending_.clear();
  }

  void release() noexcept {
    drop_pending();
    release_maps();
  }

 private:
  static std::string name_of(std::uint64_t nonce, int rank, unsigned gen) {
    char buf[80];
    std::snprintf(buf, sizeof buf, "/%s%016llx-%d-%u", mpi_shm_prefix, static_cast<unsigned long long>(nonce), rank,
                  gen);
    return buf;
  }
  static std::string why(const char* call, const std::string& name, int err) {
    return std::string(call) + "(" + name + "): " + std::strerror(err);
  }
  void release_maps() noexcept {
    for (auto* p : maps_)
      if (p) ::munmap(p, 2 * half_);
    maps_.clear();
    half_ = 0;
  }

  std::vector<std::byte*> maps_;  // every rank's segment (this rank's writable)
  std::size_t half_ = 0;
  int parity_ = 0;
  std::byte* pending_own_ = nullptr;  // this rank's new segment, before every rank agreed
  std::vector<std::pair<int, std::byte*>> peers_pending_;
  std::string pending_name_;
  int pending_rank_ = 0;
  std::size_t pending_half_ = 0;
};

}  // namespace commpact::detail
