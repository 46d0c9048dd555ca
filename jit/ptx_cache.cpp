// PtxCache: a GPU slice's PTX by (hash, sm), in memory and in the disk cache (see ptx_cache.hpp).
#include "ptx_cache.hpp"

#include <algorithm>
#include <exception>
#include <mutex>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "code_cache.hpp"
#include "jit.hpp"
#include "ptx_compile.hpp"

namespace bitship::jit {
namespace {

/// The header line's first words, and its format version: another version is refused and remade.
constexpr std::string_view kComment = "//";
constexpr std::string_view kHeaderMagic = "bitship-ptx";
constexpr std::string_view kFormat = "2";
/// "//" "bitship-ptx" <format> "llvm" <version> "sm_<N>" "libdevice" <id> "slice" <hex> "digest" <hex>
constexpr std::size_t kHeaderWords = 12;
constexpr std::size_t kLibdeviceDigits = 16;

std::string digest_of(std::string_view ptx) {
    return to_hex(hash_code(std::as_bytes(std::span(ptx.data(), ptx.size()))));
}

std::vector<std::string_view> words(std::string_view line) {
    std::vector<std::string_view> out;
    while (!line.empty()) {
        const auto start = line.find_first_not_of(' ');
        if (start == std::string_view::npos) break;
        line.remove_prefix(start);
        const auto end = std::min(line.find(' '), line.size());
        out.push_back(line.substr(0, end));
        line.remove_prefix(end);
    }
    return out;
}

} // namespace

std::string libdevice_id(std::span<const std::byte> libdevice) {
    return libdevice.empty() ? std::string("none") : to_hex(hash_code(libdevice), kLibdeviceDigits);
}

std::string encode_ptx_file(std::string_view ptx, const CodeHash& hash, unsigned sm, std::string_view libdevice) {
    std::string out = fmt::format("{} {} {} llvm {} sm_{} libdevice {} slice {} digest {}\n", kComment, kHeaderMagic, kFormat,
                                  to_string(host().llvm), sm, libdevice, to_hex(hash), digest_of(ptx));
    out.append(ptx);
    return out;
}

Result<std::string> decode_ptx_file(std::string_view file, const CodeHash& hash, unsigned sm, std::string_view libdevice) {
    const auto newline = file.find('\n');
    if (newline == std::string_view::npos) return fail(Errc::malformed_bundle, "PTX file: no header line");
    const auto w = words(file.substr(0, newline));
    const std::string_view ptx = file.substr(newline + 1);
    if (w.size() >= 3 && w[0] == kComment && w[1] == kHeaderMagic && w[2] != kFormat)
        return fail(Errc::malformed_bundle, fmt::format("PTX file: format {} (this agent writes {})", w[2], kFormat));
    if (w.size() != kHeaderWords || w[0] != kComment || w[1] != kHeaderMagic || w[3] != "llvm" || w[6] != "libdevice" ||
        w[8] != "slice" || w[10] != "digest")
        return fail(Errc::malformed_bundle, "PTX file: not a bitship PTX file (its header line)");
    if (const std::string ours = to_string(host().llvm); w[4] != ours)
        return fail(Errc::malformed_bundle, fmt::format("PTX file: made by LLVM {}; this agent is LLVM {}", w[4], ours));
    if (const std::string want = fmt::format("sm_{}", sm); w[5] != want)
        return fail(Errc::malformed_bundle, fmt::format("PTX file: made for {}, not {}", w[5], want));
    if (w[7] != libdevice)
        return fail(Errc::malformed_bundle,
                    fmt::format("PTX file: linked with libdevice {}; this agent's is {}", w[7], libdevice));
    if (w[9] != to_hex(hash)) return fail(Errc::malformed_bundle, "PTX file: it holds the PTX of another slice");
    if (w[11] != digest_of(ptx)) return fail(Errc::malformed_bundle, "PTX file: digest mismatch (torn or altered)");
    if (ptx.empty()) return fail(Errc::malformed_bundle, "PTX file: no PTX");
    return std::string(ptx);
}

PtxCache::PtxResult PtxCache::get(std::span<const std::byte> bundle, const CodeHash& expected, unsigned sm) {
    if (sm < kMinPtxSm)
        return fail(Errc::invalid_argument, fmt::format("GPU architecture sm_{}: PTX is made for sm_{} and newer", sm, kMinPtxSm));
    // GPUs newer than LLVM knows all get the PTX of the newest it knows: made and kept once.
    const Key key{expected, std::min(sm, kMaxPtxSm)};
    auto in_memory = [&]() -> std::optional<PtxResult> {
        if (auto ptx = held(key)) return ptx;
        return std::nullopt;
    };
    return in_flight_.run(key, in_memory, [&]() -> PtxResult {
        try {
            // A restarted agent, or one whose memory copy was evicted: the file made before.
            if (auto ptx = from_disk(key)) return ptx;
            return make(bundle, key);
        } catch (const std::exception& e) { // bad_alloc, mostly: an answer, not a dead agent
            return fail(Errc::internal, fmt::format("compiling PTX for {} sm_{}: {}",
                                                    to_hex(expected, kHashDigitsInMessages), key.second, e.what()));
        }
    });
}

bool PtxCache::evict(const CodeHash& hash) {
    std::unique_lock lock(mutex_);
    const auto first = memory_.lower_bound(Key{hash, 0});
    auto last = first;
    while (last != memory_.end() && last->first.first == hash) ++last;
    const bool held_any = first != last;
    memory_.erase(first, last);
    return held_any;
}

std::shared_ptr<const std::string> PtxCache::held(const Key& key) const {
    std::shared_lock lock(mutex_);
    auto it = memory_.find(key);
    return it == memory_.end() ? nullptr : it->second;
}

std::shared_ptr<const std::string> PtxCache::hold(const Key& key, std::string ptx) {
    std::unique_lock lock(mutex_);
    auto [it, added] = memory_.try_emplace(key, nullptr);
    if (added) it->second = std::make_shared<const std::string>(std::move(ptx));
    return it->second;
}

std::shared_ptr<const std::string> PtxCache::from_disk(const Key& key) {
    const auto& [hash, sm] = key;
    const DiskFile file = DiskFile::ptx(sm);
    if (!disk_.on_disk(hash, file)) return nullptr;
    Result<std::string> ptx = [&]() -> Result<std::string> {
        auto bytes = disk_.read(hash, file);
        if (!bytes) return tl::make_unexpected(bytes.error());
        return decode_ptx_file(std::string_view(reinterpret_cast<const char*>(bytes->data()), bytes->size()), hash, sm,
                               libdevice_);
    }();
    if (ptx) return hold(key, std::move(*ptx));
    // Made by another LLVM or with another libdevice, torn or altered: the slice makes it again, as an object file refused.
    spdlog::warn("jit: disk cache PTX of {} for sm_{} refused ({}); compiling its slice again",
                 to_hex(hash, kHashDigitsInMessages), sm, ptx.error().describe());
    disk_.remove(hash, file);
    return nullptr;
}

PtxCache::PtxResult PtxCache::make(std::span<const std::byte> bundle, const Key& key) {
    const auto& [hash, sm] = key;
    const std::string hex = to_hex(hash, kHashDigitsInMessages);
    // 1. The slice: the caller's bundle, or the one the disk cache kept.
    std::vector<std::byte> kept;
    const bool from_disk = bundle.empty();
    if (from_disk) {
        auto bytes = disk_.read(hash, DiskFile::bundle);
        if (!bytes) return tl::make_unexpected(bytes.error());
        kept = std::move(*bytes);
        bundle = kept;
    }
    // 2. Checked and compiled where this agent's CPU code is: in a bitship-compiler process
    //    unless the agent compiles in-process.
    auto made = compiler_->compile_ptx(bundle, hash, sm);
    if (!made) {
        // A kept bundle that is torn or altered: the client still has it, so it is asked for
        // (on_disk no longer holds). PTX made for other sm from it before stays usable.
        if (from_disk && made.error().code == Errc::malformed_bundle) {
            disk_.remove(hash, DiskFile::bundle);
            return fail(Errc::code_missing, fmt::format("disk cache entry {} was unusable and is removed ({})", hex,
                                                        made.error().describe()));
        }
        return tl::make_unexpected(made.error());
    }
    compiles_.fetch_add(1, std::memory_order_relaxed);
    spdlog::debug("jit: PTX of {} for sm_{} made (checks {:.2f} ms, compile {:.2f} ms)", hex, sm,
                  made->stats.verify_ms, made->stats.codegen_ms);
    // 3. On disk: the slice, so that a restarted agent need not ask for it, and its PTX.
    auto keep = [&](const DiskFile& file, std::span<const std::byte> bytes) {
        if (auto stored = disk_.store(hash, file, bytes); !stored)
            spdlog::warn("jit: {} of {} not kept on disk: {}", file == DiskFile::bundle ? "slice" : "PTX", hex,
                         stored.error().describe());
    };
    if (disk_.has_dir()) {
        if (!from_disk) keep(DiskFile::bundle, made->slice_bundle.empty() ? bundle : std::span<const std::byte>(made->slice_bundle));
        const std::string file = encode_ptx_file(made->ptx, hash, sm, libdevice_);
        keep(DiskFile::ptx(sm), std::as_bytes(std::span(file.data(), file.size())));
    }
    return hold(key, std::move(made->ptx));
}

} // namespace bitship::jit
