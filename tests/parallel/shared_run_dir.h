// SharedRunDir: a temporary directory every rank of an MPI test sees, with the gradient
// accumulation job's token file in it (tests/grad_accum_job.h). Rank 0 makes both and broadcasts
// the path; the others wait for it. The destructor waits for every rank, then rank 0's TempDir
// removes it. Header-only; used by test_train_grad_accum and test_train_layouts.
#pragma once

#include <mpi.h>

#include <cstdio>
#include <filesystem>
#include <optional>

#include "tests/grad_accum_job.h"
#include "tests/temp_dir.h"

namespace moepeak::test_support {

class SharedRunDir {
 public:
  SharedRunDir() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    char path[512] = {0};
    if (rank_ == 0) {
      temp_.emplace("moepeak-accum");
      write_accum_tokens(temp_->path());
      std::snprintf(path, sizeof path, "%s", temp_->path().c_str());
    }
    MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
    dir_ = path;
  }
  ~SharedRunDir() { MPI_Barrier(MPI_COMM_WORLD); }
  SharedRunDir(const SharedRunDir&) = delete;
  SharedRunDir& operator=(const SharedRunDir&) = delete;
  const std::filesystem::path& path() const { return dir_; }

 private:
  int rank_ = 0;
  std::optional<TempDir> temp_;
  std::filesystem::path dir_;
};

}  // namespace moepeak::test_support
