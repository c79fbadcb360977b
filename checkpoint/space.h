// Internal to checkpoint/: the disk space of a save, reserved before anything collective touches the disk and
// trimmed after the close (see "Crash safety, full disks" in checkpoint.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"

namespace shardsim::sharding::detail {

// Space kept free beyond a save's estimate while the HDF5 file is created, so that even a failed save can close it
// (the close writes the superblock and the root group).
constexpr uint64_t kCloseSlack = 1u << 20;

// Bytes a save needs on disk at most: the raw data (+0.2% and 1 KiB per chunk for deflate's worst case), the
// attributes, and per-object metadata. Reserved before the first collective write, see save_checkpoint.
uint64_t space_needed(const std::vector<const CheckpointEntry*>& entries,
                      const std::map<std::string, std::string>& attrs, const SaveOptions& opt);

// BYTES as "1.5 MiB".
std::string mib(uint64_t bytes);

// Rank 0: reserves BYTES for FILE (fallocate(2): the blocks are the file's from now on, so no later write of this
// save can meet a full disk or a quota). File systems without fallocate: compares with statvfs instead.
// RuntimeFault naming PATH and the cause ("No space left on device") when the space is not there; the message
// quotes SHOWN bytes as what the checkpoint needs (BYTES may include slack).
void reserve_space(const std::string& file, const std::string& path, uint64_t bytes, uint64_t shown);

// Rank 0 after the file is closed: cuts the reservation's unused tail, i.e. the file becomes exactly as long as
// HDF5's end-of-file address in the superblock (version 2/3, 8-byte addresses: bytes 28..35). A superblock it
// does not recognise is left alone (the file is valid either way; only the size differs).
void trim_to_superblock_eoa(const std::string& file, const std::string& path);

}  // namespace shardsim::sharding::detail
