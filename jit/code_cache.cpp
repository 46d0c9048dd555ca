#include "code_cache.hpp"

#include "core/coarse_clock.hpp" // every find() stamps its use: a few ms resolution orders evictions

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <system_error>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace bitship::jit {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kBundleExtension = ".bundle";
constexpr std::string_view kObjectExtension = ".obj";
constexpr std::string_view kPtxPrefix = ".sm";
constexpr std::string_view kPtxExtension = ".ptx";
constexpr std::size_t kHexDigits = 64;
/// A PTX file's sm has at most this many digits (sm_1000 would be compute capability 100.0).
constexpr std::size_t kMaxSmDigits = 3;

std::string extension_of(const DiskFile& kind) {
    switch (kind.kind) {
    case DiskFile::Kind::bundle: return std::string(kBundleExtension);
    case DiskFile::Kind::object: return std::string(kObjectExtension);
    case DiskFile::Kind::ptx: break;
    }
    return fmt::format("{}{}{}", kPtxPrefix, kind.sm, kPtxExtension);
}

/// `.sm<digits>.ptx` → that file kind (no leading zero, so one name per sm); nullopt otherwise.
std::optional<DiskFile> parse_ptx_extension(std::string_view ext) {
    if (!ext.starts_with(kPtxPrefix) || !ext.ends_with(kPtxExtension)) return std::nullopt;
    auto digits = ext.substr(kPtxPrefix.size(), ext.size() - kPtxPrefix.size() - kPtxExtension.size());
    if (digits.empty() || digits.size() > kMaxSmDigits || digits.front() == '0') return std::nullopt;
    unsigned sm = 0;
    for (char c : digits) {
        if (c < '0' || c > '9') return std::nullopt;
        sm = sm * 10 + static_cast<unsigned>(c - '0');
    }
    return DiskFile::ptx(sm);
}

/// A name no other writer (thread or process) uses at the same time.
fs::path temp_name(const fs::path& final_path) {
    static std::atomic<unsigned long> counter{0};
    return fs::path(final_path).concat(fmt::format(".tmp-{}-{}", ::getpid(), counter++));
}

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

std::int64_t file_clock_now() { return fs::file_time_type::clock::now().time_since_epoch().count(); }

/// `<64 hex digits><ext>` → the hash; nullopt for any other name (temporaries, strangers).
std::optional<std::pair<CodeHash, DiskFile>> parse_name(const std::string& name) {
    if (name.size() <= kHexDigits) return std::nullopt;
    const std::string_view ext = std::string_view(name).substr(kHexDigits);
    DiskFile kind{};
    if (ext == kBundleExtension) kind = DiskFile::bundle;
    else if (ext == kObjectExtension) kind = DiskFile::object;
    else if (auto ptx = parse_ptx_extension(ext)) kind = *ptx;
    else return std::nullopt;
    CodeHash hash{};
    for (std::size_t i = 0; i < hash.size(); ++i) {
        auto digit = [](char c) -> int {
            if (c >= '0' && c <= '9') return c - '0';
            if (c >= 'a' && c <= 'f') return c - 'a' + 10;
            return -1;
        };
        int hi = digit(name[2 * i]), lo = digit(name[2 * i + 1]);
        if (hi < 0 || lo < 0) return std::nullopt;
        hash[i] = static_cast<std::uint8_t>(hi * 16 + lo);
    }
    return std::pair{hash, kind};
}

/// Writes all of `bytes` to a new file at `path` (which must not exist).
Result<void> write_new_file(const fs::path& path, std::span<const std::byte> bytes) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return fail(Errc::io_error, fmt::format("cannot create {}: {}", path.string(), errno_text(errno)));
    std::size_t done = 0;
    while (done < bytes.size()) {
        auto n = ::write(fd, bytes.data() + done, bytes.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            int err = errno;
            ::close(fd);
            ::unlink(path.c_str());
            return fail(Errc::io_error, fmt::format("cannot write {}: {}", path.string(), errno_text(err)));
        }
        done += static_cast<std::size_t>(n);
    }
    // No fsync: after a power loss a renamed file may be empty or short, but a bundle's slice
    // hash and an object file's digest are checked again on load, so a torn file is never run.
    if (::close(fd) != 0) {
        int err = errno;
        ::unlink(path.c_str());
        return fail(Errc::io_error, fmt::format("cannot write {}: {}", path.string(), errno_text(err)));
    }
    return {};
}

} // namespace

std::size_t& CodeCache::DiskEntry::bytes_of(const DiskFile& kind) {
    switch (kind.kind) {
    case DiskFile::Kind::bundle: return bundle_bytes;
    case DiskFile::Kind::object: return object_bytes;
    case DiskFile::Kind::ptx: break;
    }
    return ptx_bytes[kind.sm];
}

std::size_t CodeCache::DiskEntry::total() const {
    std::size_t sum = bundle_bytes + object_bytes;
    for (const auto& [sm, bytes] : ptx_bytes) sum += bytes;
    return sum;
}

Result<std::unique_ptr<CodeCache>> CodeCache::open(fs::path dir, std::size_t memory_cap_bytes, std::size_t disk_cap_bytes) {
    if (!dir.empty()) {
        std::error_code ec;
        fs::create_directories(dir, ec);
        if (ec) return fail(Errc::io_error, fmt::format("code cache {}: {}", dir.string(), ec.message()));
        if (!fs::is_directory(dir, ec))
            return fail(Errc::io_error, fmt::format("code cache {} is not a directory", dir.string()));
        // Probe with a real write: permission bits do not tell the whole story (root,
        // read-only mounts, full disks).
        auto probe = temp_name(dir / "write-probe");
        if (auto ok = write_new_file(probe, {}); !ok)
            return fail(Errc::io_error, "code cache is not writable: " + ok.error().message);
        fs::remove(probe, ec);
    }
    auto cache = std::unique_ptr<CodeCache>(new CodeCache(std::move(dir), memory_cap_bytes, disk_cap_bytes));
    cache->index_dir();
    return cache;
}

// ---- memory ----

std::shared_ptr<const CompiledCode> CodeCache::find(const CodeHash& hash) const {
    std::shared_lock lock(mutex_);
    auto it = memory_.find(hash);
    if (it == memory_.end()) return nullptr;
    it->second.code->touch(coarse_now_ns());
    return it->second.code;
}

namespace {
/// A higher tier, or the whole slice where `held` is a part of it at the same tier.
bool better(const CompiledCode& code, const CompiledCode& held) {
    const unsigned tier = code.stats().tier, held_tier = held.stats().tier;
    return tier > held_tier || (tier == held_tier && held.partial() && !code.partial());
}
} // namespace

std::shared_ptr<const CompiledCode> CodeCache::insert(std::shared_ptr<const CompiledCode> code) {
    std::unique_lock lock(mutex_);
    auto [it, added] = memory_.try_emplace(code->hash());
    if (!added) {
        if (!better(*code, *it->second.code)) return it->second.code;
        memory_bytes_ -= it->second.code->code_bytes();
    }
    it->second.code = std::move(code);
    it->second.code->touch(coarse_now_ns());
    changed();
    memory_bytes_ += it->second.code->code_bytes();
    evict_memory_locked(it->first);
    return it->second.code;
}

bool CodeCache::upgrade(std::shared_ptr<const CompiledCode> code) {
    std::unique_lock lock(mutex_);
    auto it = memory_.find(code->hash());
    if (it == memory_.end() || !better(*code, *it->second.code)) return false;
    memory_bytes_ -= it->second.code->code_bytes();
    memory_bytes_ += code->code_bytes();
    // The old tier stays loaded while a caller holds it; its last holder unloads it. The new
    // one is as recently used as the old.
    code->touch(std::max(code->last_use(), it->second.code->last_use()));
    it->second.code = std::move(code);
    changed();
    evict_memory_locked(it->first);
    return true;
}

std::optional<unsigned> CodeCache::tier_of(const CodeHash& hash) const {
    std::shared_lock lock(mutex_);
    auto it = memory_.find(hash);
    if (it == memory_.end()) return std::nullopt;
    return it->second.code->stats().tier;
}

bool CodeCache::evict(const CodeHash& hash) {
    std::unique_lock lock(mutex_);
    auto it = memory_.find(hash);
    if (it == memory_.end()) return false;
    memory_bytes_ -= it->second.code->code_bytes();
    memory_.erase(it);
    changed();
    return true;
}

void CodeCache::evict_memory_locked(const CodeHash& keep) {
    if (memory_cap_ == 0) return;
    while (memory_bytes_ > memory_cap_) {
        // The least recently used entry that only the cache holds: code a call is running
        // (a shared_ptr held elsewhere) is never evicted. Nothing evictable: over the cap
        // until those calls end (the next insert tries again).
        auto victim = memory_.end();
        for (auto it = memory_.begin(); it != memory_.end(); ++it) {
            if (it->first == keep || it->second.code.use_count() > 1) continue;
            if (victim == memory_.end() || it->second.code->last_use() < victim->second.code->last_use()) victim = it;
        }
        if (victim == memory_.end()) return;
        memory_bytes_ -= victim->second.code->code_bytes();
        memory_.erase(victim);
        changed();
    }
}

std::vector<CachedCodeInfo> CodeCache::list() const {
    std::vector<CachedCodeInfo> out;
    {
        std::shared_lock lock(mutex_);
        out.reserve(memory_.size());
        for (const auto& [hash, slot] : memory_) {
            CachedCodeInfo info;
            info.hash = hash;
            info.code_bytes = slot.code->code_bytes();
            info.tier = slot.code->stats().tier;
            info.last_use = std::chrono::steady_clock::time_point(
                std::chrono::nanoseconds(slot.code->last_use()));
            info.in_use = slot.code.use_count() > 1;
            info.stats = slot.code->stats();
            out.push_back(std::move(info));
        }
    }
    {
        std::lock_guard lock(disk_mutex_);
        for (auto& info : out)
            if (auto it = disk_.find(info.hash); it != disk_.end()) info.disk_bytes = it->second.total();
    }
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.last_use < b.last_use; });
    return out;
}

std::size_t CodeCache::memory_bytes() const {
    std::shared_lock lock(mutex_);
    return memory_bytes_;
}

// ---- disk ----

void CodeCache::index_dir() {
    if (dir_.empty()) return;
    std::error_code ec;
    std::lock_guard lock(disk_mutex_);
    for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
        auto parsed = parse_name(it->path().filename().string());
        if (!parsed) continue;
        std::error_code size_ec, time_ec;
        auto size = it->file_size(size_ec);
        auto mtime = it->last_write_time(time_ec);
        if (size_ec || time_ec) continue;
        auto& entry = disk_[parsed->first];
        entry.bytes_of(parsed->second) = static_cast<std::size_t>(size);
        entry.last_use = std::max(entry.last_use, std::int64_t(mtime.time_since_epoch().count()));
        disk_bytes_ += static_cast<std::size_t>(size);
    }
    if (disk_cap_ != 0 && disk_bytes_ > disk_cap_) evict_disk_locked(CodeHash{});
}

fs::path CodeCache::path_of(const CodeHash& hash, DiskFile kind) const {
    return dir_ / (to_hex(hash) + std::string(extension_of(kind)));
}

bool CodeCache::on_disk(const CodeHash& hash, DiskFile kind) const {
    if (dir_.empty()) return false;
    std::error_code ec;
    return fs::is_regular_file(path_of(hash, kind), ec);
}

Result<void> CodeCache::store(const CodeHash& hash, DiskFile kind, std::span<const std::byte> bytes) {
    if (dir_.empty()) return {};
    auto final_path = path_of(hash, kind);
    auto temp = temp_name(final_path);
    if (auto ok = write_new_file(temp, bytes); !ok) return ok;
    // rename() is atomic: readers see the old state or the whole new file, never part of it.
    if (::rename(temp.c_str(), final_path.c_str()) != 0) {
        int err = errno;
        ::unlink(temp.c_str());
        return fail(Errc::io_error, fmt::format("cannot rename {} to {}: {}", temp.string(),
                                                final_path.string(), errno_text(err)));
    }
    std::lock_guard lock(disk_mutex_);
    auto& entry = disk_[hash];
    auto& size = entry.bytes_of(kind);
    disk_bytes_ = disk_bytes_ - size + bytes.size();
    size = bytes.size();
    entry.last_use = file_clock_now();
    evict_disk_locked(hash);
    return {};
}

void CodeCache::evict_disk_locked(const CodeHash& keep) {
    if (disk_cap_ == 0) return;
    while (disk_bytes_ > disk_cap_) {
        auto victim = disk_.end();
        for (auto it = disk_.begin(); it != disk_.end(); ++it)
            if (it->first != keep && (victim == disk_.end() || it->second.last_use < victim->second.last_use)) victim = it;
        if (victim == disk_.end()) return; // one slice larger than the cap: keep it
        std::error_code ec;
        fs::remove(path_of(victim->first, DiskFile::bundle), ec);
        fs::remove(path_of(victim->first, DiskFile::object), ec);
        for (const auto& [sm, bytes] : victim->second.ptx_bytes) fs::remove(path_of(victim->first, DiskFile::ptx(sm)), ec);
        disk_bytes_ -= victim->second.total();
        spdlog::debug("jit: disk cache evicts {}", to_hex(victim->first, kHashDigitsInMessages));
        disk_.erase(victim);
    }
}

Result<std::vector<std::byte>> CodeCache::read(const CodeHash& hash, DiskFile kind) {
    if (dir_.empty())
        return fail(Errc::code_missing, fmt::format("no code cache directory for {}", to_hex(hash, kHashDigitsInMessages)));
    auto path = path_of(hash, kind);
    std::ifstream in(path, std::ios::binary);
    if (!in) return fail(Errc::code_missing, fmt::format("{} is not in the disk cache", to_hex(hash, kHashDigitsInMessages)));
    std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) return fail(Errc::io_error, fmt::format("cannot read {}", path.string()));
    std::vector<std::byte> bytes(chars.size());
    if (!chars.empty()) std::memcpy(bytes.data(), chars.data(), chars.size());
    std::error_code ec;
    fs::last_write_time(path, fs::file_time_type::clock::now(), ec); // best effort: eviction order only
    std::lock_guard lock(disk_mutex_);
    if (auto it = disk_.find(hash); it != disk_.end()) it->second.last_use = file_clock_now();
    return bytes;
}

void CodeCache::remove(const CodeHash& hash, std::optional<DiskFile> kind) {
    if (dir_.empty()) return;
    std::error_code ec;
    std::lock_guard lock(disk_mutex_);
    auto it = disk_.find(hash);
    auto drop = [&](const DiskFile& k) {
        fs::remove(path_of(hash, k), ec);
        if (it == disk_.end()) return;
        disk_bytes_ -= it->second.bytes_of(k);
        if (k.kind == DiskFile::Kind::ptx) it->second.ptx_bytes.erase(k.sm);
        else it->second.bytes_of(k) = 0;
    };
    if (kind) {
        drop(*kind);
    } else {
        drop(DiskFile::bundle);
        drop(DiskFile::object);
        // The PTX files indexed: this process's, and those there when it started.
        if (it != disk_.end())
            for (const auto sms = it->second.ptx_bytes; const auto& [sm, bytes] : sms) drop(DiskFile::ptx(sm));
    }
    if (it != disk_.end() && it->second.total() == 0 && it->second.ptx_bytes.empty()) disk_.erase(it);
}

std::size_t CodeCache::disk_bytes() const {
    std::lock_guard lock(disk_mutex_);
    return disk_bytes_;
}

std::vector<CodeHash> CodeCache::objects_most_recent_first() const {
    std::vector<std::pair<std::int64_t, CodeHash>> found;
    {
        std::lock_guard lock(disk_mutex_);
        for (const auto& [hash, entry] : disk_)
            if (entry.object_bytes > 0) found.emplace_back(entry.last_use, hash);
    }
    std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<CodeHash> out;
    out.reserve(found.size());
    for (const auto& f : found) out.push_back(f.second);
    return out;
}

} // namespace bitship::jit
