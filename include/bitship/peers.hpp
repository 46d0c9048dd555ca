#pragma once
/// @file
/// The peers file: the agents of one launched job, in rank order. Rank 0 of `mpirun xagent
/// --peers-file PATH` (or `srun --mpi=pmix`) writes it after the agents found each other;
/// clients open it with Client::connect_all().
///
/// One line per agent, after a `# bitship peers 1` header line:
/// @code
///   # bitship peers 1
///   0 127.0.0.1:40123 node01 x86_64-pc-linux-gnu 0
///   1 127.0.0.1:40177 node01 x86_64-pc-linux-gnu 0
/// @endcode

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <bitship/errc.hpp>

namespace bitship {

/// One agent of a job, as its peers file lists it.
struct PeerRecord {
    std::uint32_t rank = 0;
    std::string address; ///< "host:port" it listens on
    std::string host;    ///< the node's host name
    std::string triple;  ///< its target triple
    std::uint32_t gpus = 0;

    friend bool operator==(const PeerRecord&, const PeerRecord&) = default;
};

/// Parses a peers file's text: ranks must be 0..N-1, each once, every field present and
/// without blanks. Errors (invalid_argument) name the line and what is wrong with it.
Result<std::vector<PeerRecord>> parse_peers(std::string_view text);
/// parse_peers() of a file; io_error when it cannot be read.
Result<std::vector<PeerRecord>> read_peers_file(const std::filesystem::path& path);
/// The text parse_peers() reads back, records sorted by rank.
std::string format_peers(std::vector<PeerRecord> peers);
/// Writes format_peers() to a temporary file beside `path` and renames it, so a reader never
/// sees half a file.
Result<void> write_peers_file(const std::filesystem::path& path, const std::vector<PeerRecord>& peers);

} // namespace bitship
