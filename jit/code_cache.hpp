#pragma once
// The content-addressed code cache: compiled code in memory by hash (bounded, least recently
// used evicted first), and on disk per hash the single-slice bundle it was compiled from
// (`<dir>/<hex64>.bundle`, so a restarted agent can recompile, and forward, without asking the
// client to resend), the optimised object (`<dir>/<hex64>.obj`, see object_file.hpp) and, for a
// GPU slice, its PTX per GPU architecture (`<dir>/<hex64>.sm<NN>.ptx`, see ptx_cache.hpp), also
// bounded: a hash's files are evicted together. Private to jit/.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include <bitship/bundle.hpp>
#include <bitship/errc.hpp>

#include "jit.hpp"

namespace bitship::jit {

/// One of the files the disk cache holds for a hash: DiskFile::bundle, DiskFile::object, or
/// DiskFile::ptx(sm).
struct DiskFile {
    enum class Kind : std::uint8_t { bundle, object, ptx };
    Kind kind = Kind::bundle;
    unsigned sm = 0; ///< Kind::ptx: the GPU architecture it was made for (sm_<sm>)

    static const DiskFile bundle;
    static const DiskFile object;
    static constexpr DiskFile ptx(unsigned sm) { return {Kind::ptx, sm}; }
    friend bool operator==(const DiskFile&, const DiskFile&) = default;
};
inline constexpr DiskFile DiskFile::bundle{DiskFile::Kind::bundle, 0};
inline constexpr DiskFile DiskFile::object{DiskFile::Kind::object, 0};

class CodeCache {
public:
    /// A cache in memory only when `dir` is empty. Otherwise creates `dir` if missing, checks
    /// that a file can be written there (io_error if not) and indexes the files already there.
    /// A cap of 0 bytes is no cap.
    static Result<std::unique_ptr<CodeCache>> open(std::filesystem::path dir, std::size_t memory_cap_bytes,
                                                   std::size_t disk_cap_bytes);

    // ---- memory: thread-safe ----

    /// The code held for `hash`, or nullptr; marks it used. A shared lock only.
    [[nodiscard]] std::shared_ptr<const CompiledCode> find(const CodeHash& hash) const;
    /// Keeps `code` under its hash; when that hash is already held, returns the one held,
    /// unless `code` is better (upgrade()), which then replaces it. Then evicts the least
    /// recently used code no one else holds until the cap is met again.
    std::shared_ptr<const CompiledCode> insert(std::shared_ptr<const CompiledCode> code);
    /// Replaces the code held for `code`'s hash when the one held is of a lower tier, or of the
    /// same tier and only part of the slice (CompiledCode::partial) where `code` is whole. False
    /// (and nothing changes) when the hash is not held (evicted meanwhile) or already as good.
    bool upgrade(std::shared_ptr<const CompiledCode> code);
    /// The tier held for `hash`, without marking it used; nullopt when none is held.
    [[nodiscard]] std::optional<unsigned> tier_of(const CodeHash& hash) const;
    /// Drops the cache's reference to `hash`; false if it held none.
    bool evict(const CodeHash& hash);
    /// Every entry, least recently used first.
    [[nodiscard]] std::vector<CachedCodeInfo> list() const;
    /// Bytes of code held (CompiledCode::code_bytes summed).
    [[nodiscard]] std::size_t memory_bytes() const;
    /// Changes whenever the code held for some hash does (Jit::cache_generation).
    [[nodiscard]] std::uint64_t generation() const noexcept { return generation_.load(std::memory_order_acquire); }

    // ---- disk: thread-safe ----

    [[nodiscard]] bool has_dir() const { return !dir_.empty(); }
    /// Whether the file is there (one stat call).
    [[nodiscard]] bool on_disk(const CodeHash& hash, DiskFile kind = DiskFile::bundle) const;
    /// Writes `bytes` as the file for `hash`: to a temporary name first, then renamed, so a
    /// crash leaves either the whole file or none. An existing file is replaced. Then evicts
    /// the least recently used hashes (both files) until the disk cap is met again.
    [[nodiscard]] Result<void> store(const CodeHash& hash, DiskFile kind, std::span<const std::byte> bytes);
    /// The file's bytes, or code_missing when there is none (io_error when it cannot be read).
    /// Marks the hash used (also in the file's mtime, for the next process's eviction order).
    [[nodiscard]] Result<std::vector<std::byte>> read(const CodeHash& hash, DiskFile kind);
    /// Deletes the file for `hash` (or all of them when `kind` is empty), if any.
    void remove(const CodeHash& hash, std::optional<DiskFile> kind = std::nullopt);
    [[nodiscard]] std::filesystem::path path_of(const CodeHash& hash, DiskFile kind = DiskFile::bundle) const;
    /// Bytes of the files indexed (this process's view; another agent sharing the directory
    /// is not seen until restart).
    [[nodiscard]] std::size_t disk_bytes() const;
    /// The hashes with an object file, most recently used first: what a restarted agent links
    /// ahead of its first calls.
    [[nodiscard]] std::vector<CodeHash> objects_most_recent_first() const;
    /// The memory cap in bytes (0: none).
    [[nodiscard]] std::size_t memory_cap() const noexcept { return memory_cap_; }

private:
    CodeCache(std::filesystem::path dir, std::size_t memory_cap, std::size_t disk_cap)
        : dir_(std::move(dir)), memory_cap_(memory_cap), disk_cap_(disk_cap) {}
    void index_dir();
    void evict_memory_locked(const CodeHash& keep);
    void evict_disk_locked(const CodeHash& keep);

    struct HashHasher {
        std::size_t operator()(const CodeHash& h) const noexcept {
            std::size_t v = 0;
            std::memcpy(&v, h.data(), sizeof v); // the hash is already uniform
            return v;
        }
    };
    struct Slot {
        std::shared_ptr<const CompiledCode> code; ///< its last use: CompiledCode::last_use
    };
    struct DiskEntry {
        std::size_t bundle_bytes = 0;
        std::size_t object_bytes = 0;
        std::map<unsigned, std::size_t> ptx_bytes; ///< by sm
        std::int64_t last_use = 0; ///< a file_time count: ordering only
        /// The size recorded for `kind`'s file (0: none).
        std::size_t& bytes_of(const DiskFile& kind);
        [[nodiscard]] std::size_t total() const;
    };

    std::filesystem::path dir_;
    const std::size_t memory_cap_;
    const std::size_t disk_cap_;

    mutable std::shared_mutex mutex_; // memory_, memory_bytes_
    std::unordered_map<CodeHash, Slot, HashHasher> memory_;
    std::size_t memory_bytes_ = 0;
    /// Bumped (under the unique lock) by every change of the code memory_ holds.
    std::atomic<std::uint64_t> generation_{0};
    void changed() noexcept { generation_.fetch_add(1, std::memory_order_release); }

    mutable std::mutex disk_mutex_; // disk_, disk_bytes_
    std::map<CodeHash, DiskEntry> disk_;
    std::size_t disk_bytes_ = 0;
};

} // namespace bitship::jit
