#pragma once
/// The checkpoint of a recovery run: an HDF5 file holding the RecoveryState (adapters and
/// optimizer moments in double, bit for bit, and the loss curve) and the settings of the run
/// that wrote it, with a checksum over every number so that a damaged file is refused rather
/// than continued from. Layout:
///
///   /            attributes format = "sparsim recover checkpoint", version, settings, step,
///                checksum (16 hex digits)
///   /adapters/<blk.L.attn_x>/A [rank][in], B [out][rank]   (attributes layer, proj)
///   /optimizer/m, /optimizer/v                              (flat, adapter order, A then B)
///   /curve/<field>                                          (one entry per step done)
#include "recovery/recover.hpp"

#include <string>

namespace sparsim::recovery {

struct Checkpoint {
  std::string settings;  ///< what the run's result depends on, "name = value" lines
  RecoveryState state;
};

/// Writes `path` atomically (temporary file, then rename).
void write_checkpoint(const std::string& path, const Checkpoint& c);

/// Reads `path`. Throws sparsim::Error naming the file and the problem for a file that is not a
/// recovery checkpoint, of another version, truncated, damaged (checksum) or inconsistent.
Checkpoint read_checkpoint(const std::string& path);

}  // namespace sparsim::recovery
