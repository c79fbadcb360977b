// Internal to checkpoint/: the disk space of a save, reserved before anything collective touches the disk and
// trimmed after the close (see "Crash safety, full disks" in checkpoint.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"

namespace shardsim::checkpoint::detail {

// The reservation's parts beyond the data (docs/RELIABILITY.md states them as the margin): measured files hold
// about 0.7 KiB of metadata per tensor (a training checkpoint: 63 tensors, 68,544 data bytes, a 110,953-byte
// file), so these bounds are about 4x what HDF5 writes; the trim gives the unused part back after the close.
inline constexpr uint64_t kBaseMetadata = 64u << 10;  // superblock, root group, free-space and heap blocks
inline constexpr uint64_t kPerTensor = 3u << 10;      // object header, attributes, link, manifest entry
inline constexpr uint64_t kPerGroup = 4u << 10;       // a group's header and link storage
inline constexpr uint64_t kPerAttribute = 1u << 10;   // beside the root attribute's name and value
// Space kept free beyond a save's estimate while the HDF5 file is created, so that even a failed save can close it
// (the close writes the superblock and the root group).
inline constexpr uint64_t kCloseSlack = 64u << 10;

// Bytes a save needs on disk at most: the raw data, the edge chunks' padding (+0.2% and 1 KiB per chunk for
// deflate's worst case), the attributes, and per-object metadata (the constants above). CHUNKS: each tensor's
// chunk dimensions as the save lays it out (empty: contiguous). Reserved before the first collective write.
uint64_t space_needed(const std::vector<const CheckpointEntry*>& entries,
                      const std::map<std::string, std::string>& attrs, const SaveOptions& opt,
                      const std::vector<runtime::Shape>& chunks);

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

}  // namespace shardsim::checkpoint::detail
