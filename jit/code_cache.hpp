#pragma once
// The content-addressed code cache: compiled code in memory by hash, and the single-slice
// bundles it was compiled from on disk (`<dir>/<hex64>.bundle`), so a restarted agent can
// recompile without asking the client to resend. Private to jit/.

#include <cstddef>
#include <filesystem>
#include <map>
#include <memory>
#include <shared_mutex>
#include <span>
#include <vector>

#include <bitship/bundle.hpp>
#include <bitship/errc.hpp>

#include "jit.hpp"

namespace bitship::jit {

class CodeCache {
public:
    /// A cache in memory only when `dir` is empty. Otherwise creates `dir` if missing and checks
    /// that a file can be written there (io_error if not).
    static Result<std::unique_ptr<CodeCache>> open(std::filesystem::path dir);

    /// Thread-safe.
    [[nodiscard]] std::shared_ptr<const CompiledCode> find(const CodeHash& hash) const;
    /// Keeps `code` under its hash; when that hash is already held, returns the one held.
    std::shared_ptr<const CompiledCode> insert(std::shared_ptr<const CompiledCode> code);

    [[nodiscard]] bool has_dir() const { return !dir_.empty(); }
    [[nodiscard]] bool on_disk(const CodeHash& hash) const;
    /// Writes `bundle` as the file for `hash`: to a temporary name first, then renamed, so a
    /// crash leaves either the whole file or none. An existing file is left as it is.
    [[nodiscard]] Result<void> store(const CodeHash& hash, std::span<const std::byte> bundle) const;
    /// The file's bytes, or code_missing when there is none (io_error when it cannot be read).
    [[nodiscard]] Result<std::vector<std::byte>> read(const CodeHash& hash) const;
    /// Deletes the file for `hash`, if any.
    void remove(const CodeHash& hash) const;
    [[nodiscard]] std::filesystem::path path_of(const CodeHash& hash) const;

private:
    explicit CodeCache(std::filesystem::path dir) : dir_(std::move(dir)) {}

    std::filesystem::path dir_;
    mutable std::shared_mutex mutex_;
    std::map<CodeHash, std::shared_ptr<const CompiledCode>> memory_;
};

} // namespace bitship::jit
