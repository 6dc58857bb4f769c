#pragma once
/// MPI front end of the sweep (built with -DSPARSIM_MPI=ON). `mpirun -n N sparsim sweep SPEC`
/// starts N ranks; rank 0 plans and hands tasks to free ranks (itself included), calibrations
/// first, then points longest predicted first; each rank runs one task at a time with its own
/// threads, or its own GPU (one per rank, by local rank). Every task is still claimed through
/// its lock, so an MPI sweep and other sweeps on the same folder never run a point twice.
#include "sweep/runner.hpp"

namespace sparsim::sweep {

/// True when this binary was built with MPI.
bool built_with_mpi();
/// True when the environment says the process was started by mpirun / mpiexec / srun with an
/// MPI launcher (Open MPI, MPICH, Intel MPI or PMIx variables).
bool launched_by_mpi();

/// MPI_Init / MPI_Finalize for the life of the object, and the facts the sweep needs.
class MpiWorld {
 public:
  MpiWorld(int* argc, char*** argv);
  ~MpiWorld();
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  /// Rank 0's `ok` on every rank (collective).
  bool agree(bool ok_on_root) const;
  void barrier() const;
  /// Ends every rank (a worker that cannot go on).
  [[noreturn]] void abort(int code) const;

 private:
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
};

/// The MPI worker loop; collective (every rank calls it). Rank 0's result counts every rank's
/// tasks; the other ranks return theirs.
SweepResult run_mpi(const Plan& plan, const Store& store, const LoopOptions& opt,
                    const MpiWorld& world);

}  // namespace sparsim::sweep
