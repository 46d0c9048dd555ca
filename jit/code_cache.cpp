#include "code_cache.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <system_error>

#include <fmt/format.h>

namespace bitship::jit {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kExtension = ".bundle";

/// A name no other writer (thread or process) uses at the same time.
fs::path temp_name(const fs::path& final_path) {
    static std::atomic<unsigned long> counter{0};
    return fs::path(final_path).concat(fmt::format(".tmp-{}-{}", ::getpid(), counter++));
}

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

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
    // No fsync: after a power loss a renamed file may be empty or short, but load() checks
    // the slice hash again and discards such a file, so a torn file is never run.
    if (::close(fd) != 0) {
        int err = errno;
        ::unlink(path.c_str());
        return fail(Errc::io_error, fmt::format("cannot write {}: {}", path.string(), errno_text(err)));
    }
    return {};
}

} // namespace

Result<std::unique_ptr<CodeCache>> CodeCache::open(fs::path dir) {
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
    return std::unique_ptr<CodeCache>(new CodeCache(std::move(dir)));
}

std::shared_ptr<const CompiledCode> CodeCache::find(const CodeHash& hash) const {
    std::shared_lock lock(mutex_);
    auto it = memory_.find(hash);
    return it == memory_.end() ? nullptr : it->second;
}

std::shared_ptr<const CompiledCode> CodeCache::insert(std::shared_ptr<const CompiledCode> code) {
    std::unique_lock lock(mutex_);
    auto [it, added] = memory_.try_emplace(code->hash(), code);
    return it->second;
}

fs::path CodeCache::path_of(const CodeHash& hash) const {
    return dir_ / (to_hex(hash) + std::string(kExtension));
}

bool CodeCache::on_disk(const CodeHash& hash) const {
    if (dir_.empty()) return false;
    std::error_code ec;
    return fs::is_regular_file(path_of(hash), ec);
}

Result<void> CodeCache::store(const CodeHash& hash, std::span<const std::byte> bundle) const {
    if (dir_.empty() || on_disk(hash)) return {};
    auto final_path = path_of(hash);
    auto temp = temp_name(final_path);
    if (auto ok = write_new_file(temp, bundle); !ok) return ok;
    // rename() is atomic: readers see the old state or the whole new file, never part of it.
    if (::rename(temp.c_str(), final_path.c_str()) != 0) {
        int err = errno;
        ::unlink(temp.c_str());
        return fail(Errc::io_error, fmt::format("cannot rename {} to {}: {}", temp.string(),
                                                final_path.string(), errno_text(err)));
    }
    return {};
}

Result<std::vector<std::byte>> CodeCache::read(const CodeHash& hash) const {
    if (dir_.empty()) return fail(Errc::code_missing, fmt::format("no code cache directory for {}", to_hex(hash, 16)));
    auto path = path_of(hash);
    std::ifstream in(path, std::ios::binary);
    if (!in) return fail(Errc::code_missing, fmt::format("{} is not in the disk cache", to_hex(hash, 16)));
    std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) return fail(Errc::io_error, fmt::format("cannot read {}", path.string()));
    std::vector<std::byte> bytes(chars.size());
    if (!chars.empty()) std::memcpy(bytes.data(), chars.data(), chars.size());
    return bytes;
}

void CodeCache::remove(const CodeHash& hash) const {
    if (dir_.empty()) return;
    std::error_code ec;
    fs::remove(path_of(hash), ec);
}

} // namespace bitship::jit
