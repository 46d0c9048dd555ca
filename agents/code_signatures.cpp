#include "code_signatures.hpp"

#include <unistd.h>

#include <array>
#include <cstring>
#include <fstream>
#include <memory>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/signing.hpp"

namespace bitship::agent {
namespace {
constexpr std::string_view kExtension = ".sig";
} // namespace

std::size_t CodeSignatures::HashHasher::operator()(const CodeHash& h) const noexcept {
    std::size_t v;
    std::memcpy(&v, h.data(), sizeof v);
    return v;
}

CodeSignatures::CodeSignatures(std::filesystem::path dir) : dir_(std::move(dir)) {
    if (dir_.empty()) return;
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec) {
        spdlog::warn("cannot make {} ({}): code signatures are kept in memory only", dir_.string(), ec.message());
        dir_.clear();
        return;
    }
    writer_ = std::make_unique<BackgroundJobs>("bitship-sigs"); // a thread: started now, not on a call's path
}

std::optional<Error> CodeSignatures::remember(std::span<const wire::CodeSignature> signatures, const CodeHash& own,
                                              const Authorizes& authorizes) {
    std::optional<Error> refused;
    for (const auto& s : signatures) {
        if (auto it = kept_.find(s.hash); it != kept_.end()) {
            if (it->second == s) continue; // checked when it came first
            if (authorizes(it->second.signer)) continue;
        }
        if (!signing::verify_code(s.signer, s.signature, s.hash)) {
            if (s.hash == own && !refused)
                refused = Error{Errc::unauthorized, fmt::format("the signature over code {} by key {} does not verify",
                                                                to_hex(s.hash, 16), fingerprint(s.signer))};
            continue;
        }
        keep(s, true);
    }
    return refused;
}

const wire::CodeSignature* CodeSignatures::find(const CodeHash& hash) {
    if (auto it = kept_.find(hash); it != kept_.end()) return &it->second;
    if (dir_.empty()) return nullptr;
    auto s = read_back(hash);
    if (!s) return nullptr;
    keep(*s, false);
    return &kept_.at(hash);
}

std::vector<wire::CodeSignature> CodeSignatures::for_bundle(std::span<const std::byte> bundle) {
    std::vector<wire::CodeSignature> out;
    auto view = BundleView::parse(bundle);
    if (!view) return out;
    for (const auto& slice : view->slices)
        if (const auto* s = find(slice.hash)) out.push_back(*s);
    return out;
}

void CodeSignatures::keep(const wire::CodeSignature& s, bool write) {
    auto [it, fresh] = kept_.insert_or_assign(s.hash, s);
    if (fresh) order_.push_back(s.hash);
    while (kept_.size() > kMaxEntries && !order_.empty()) {
        kept_.erase(order_.front());
        order_.pop_front();
    }
    if (write) persist(s);
}

void CodeSignatures::persist(const wire::CodeSignature& s) {
    if (!writer_) return;
    std::array<char, wire::kCodeSignatureBytes> bytes{};
    std::memcpy(bytes.data(), s.hash.data(), 32);
    std::memcpy(bytes.data() + 32, s.signer.data(), 32);
    std::memcpy(bytes.data() + 64, s.signature.data(), 64);
    auto path = dir_ / (to_hex(s.hash) + std::string(kExtension));
    bool queued = writer_->post([path, bytes] {
        {
            std::array<char, wire::kCodeSignatureBytes + 1> have{};
            std::ifstream in(path, std::ios::binary);
            if (in && in.read(have.data(), have.size()).gcount() == static_cast<std::streamsize>(bytes.size()) &&
                std::memcmp(have.data(), bytes.data(), bytes.size()) == 0)
                return; // already there: a restarted agent is sent the same signature again
        }
        auto temp = path;
        temp += fmt::format(".tmp{}", getpid());
        {
            std::ofstream out(temp, std::ios::binary | std::ios::trunc);
            out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
            if (!out) {
                spdlog::warn("cannot write {}: a signature stays in memory only", temp.string());
                return;
            }
        }
        std::error_code ec;
        std::filesystem::rename(temp, path, ec);
        if (ec) std::filesystem::remove(temp, ec);
    });
    if (!queued) spdlog::warn("too many signatures wait to be written: {} stays in memory only", to_hex(s.hash, 16));
}

std::optional<wire::CodeSignature> CodeSignatures::read_back(const CodeHash& hash) const {
    std::ifstream in(dir_ / (to_hex(hash) + std::string(kExtension)), std::ios::binary);
    if (!in) return std::nullopt;
    wire::CodeSignature s;
    std::array<char, wire::kCodeSignatureBytes + 1> bytes{};
    in.read(bytes.data(), bytes.size());
    if (in.gcount() != static_cast<std::streamsize>(wire::kCodeSignatureBytes)) return std::nullopt;
    std::memcpy(s.hash.data(), bytes.data(), 32);
    std::memcpy(s.signer.data(), bytes.data() + 32, 32);
    std::memcpy(s.signature.data(), bytes.data() + 64, 64);
    if (s.hash != hash || !signing::verify_code(s.signer, s.signature, s.hash)) {
        spdlog::warn("ignoring the signature file of {}: it does not verify", to_hex(hash, 16));
        return std::nullopt;
    }
    return s;
}

} // namespace bitship::agent
