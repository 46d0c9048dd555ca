#include "regions.hpp"

#include "sandbox_arena.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <mutex>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace bitship::agent {

namespace {
// From this size on, random access to a region on 4 KiB pages misses the TLB at almost every
// access (the TLB covers a few MiB of 4 KiB pages), where 2 MiB pages would mostly hit.
constexpr std::size_t kHugePagesMatter = std::size_t{64} << 20;
} // namespace

Result<RegionSpec> parse_region_spec(std::string_view spec) {
    auto eq = spec.find('=');
    if (eq == std::string_view::npos || eq == 0 || eq + 1 == spec.size())
        return fail(Errc::invalid_argument, fmt::format("region '{}' is not NAME=SIZE", spec));
    RegionSpec out;
    out.name = std::string(spec.substr(0, eq));
    auto size = spec.substr(eq + 1);
    if (auto at = size.find('@'); at != std::string_view::npos) {
        auto where = size.substr(at + 1);
        size = size.substr(0, at);
        unsigned device = 0;
        auto digits = where.substr(std::min<std::size_t>(3, where.size()));
        auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), device);
        if (!where.starts_with("gpu") || digits.empty() || ec != std::errc{} || end != digits.data() + digits.size())
            return fail(Errc::invalid_argument, fmt::format("region '{}': '@{}' names no GPU (gpu0, gpu1, ...)", spec, where));
        out.gpu = device;
    }
    std::size_t i = 0;
    unsigned long long value = 0;
    while (i < size.size() && std::isdigit(static_cast<unsigned char>(size[i]))) {
        if (value > (~0ull) / 10) return fail(Errc::invalid_argument, fmt::format("region size '{}' is too large", size));
        value = value * 10 + static_cast<unsigned>(size[i++] - '0');
    }
    auto unit = std::string(size.substr(i));
    for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    unsigned shift = 0;
    if (unit.empty() || unit == "B") shift = 0;
    else if (unit == "K" || unit == "KB" || unit == "KIB") shift = 10;
    else if (unit == "M" || unit == "MB" || unit == "MIB") shift = 20;
    else if (unit == "G" || unit == "GB" || unit == "GIB") shift = 30;
    else return fail(Errc::invalid_argument, fmt::format("region size '{}': unknown unit '{}' (K, M, G)", size, unit));
    if (i == 0 || value == 0) return fail(Errc::invalid_argument, fmt::format("region size '{}' must be a positive number", size));
    if (value > (~0ull >> shift)) return fail(Errc::invalid_argument, fmt::format("region size '{}' is too large", size));
    out.size = static_cast<std::size_t>(value << shift);
    return out;
}

RegionTable::~RegionTable() { clear(); }

Result<const Region*> RegionTable::create(const std::string& name, std::size_t size) {
    if (name.empty()) return fail(Errc::invalid_argument, "a region needs a name");
    {
        std::shared_lock lock(mutex_);
        if (auto it = regions_.find(name); it != regions_.end()) return it->second.get();
    }
    std::byte* at = nullptr;
    if (arena_) {
        auto place = arena_->allocate_region(size);
        if (!place) return fail(place.error().code, fmt::format("region '{}' ({} bytes): {}", name, size, place.error().message));
        at = *place;
    }
    auto mapped = engine_.map_memory(size, memory_, at);
    if (!mapped) {
        if (at) arena_->release_region(at, size);
        return fail(mapped.error().code, fmt::format("region '{}' ({} bytes): {}", name, size, mapped.error().message));
    }
    auto r = std::make_unique<Region>();
    r->name = name;
    r->base = mapped->base;
    r->size = size;
    r->mapped = std::move(*mapped);
    spdlog::info("region '{}': {} bytes of {} memory at {}, {}", name, size,
                 memory_ == Engine::RegionMemory::shared ? "shared" : "private", r->base, r->mapped.pages);
    if (memory_ == Engine::RegionMemory::shared && size >= kHugePagesMatter && shared_huge_pages_off())
        spdlog::warn("region '{}' ({} MiB) is on 4 KiB pages: this host gives shared memory no huge pages ({}), so every "
                     "random access to it costs a TLB miss (a 1 GiB pointer chase on the machine this was measured on: 1.5x slower). As root: echo advise > "
                     "/sys/kernel/mm/transparent_hugepage/shmem_enabled, or reserve hugetlb pages (sysctl vm.nr_hugepages)",
                     name, size >> 20, shared_huge_pages());
    std::unique_lock lock(mutex_);
    auto [it, inserted] = regions_.emplace(name, std::move(r));
    return it->second.get();
}

const Region* RegionTable::find(std::string_view name) const {
    std::shared_lock lock(mutex_);
    auto it = regions_.find(name);
    return it == regions_.end() ? nullptr : it->second.get();
}

void RegionTable::clear() {
    std::unique_lock lock(mutex_);
    for (auto& [name, r] : regions_) {
        auto* base = static_cast<std::byte*>(r->mapped.base);
        auto length = r->mapped.mapped_length;
        bool fixed = r->mapped.fixed;
        engine_.unmap_memory(r->mapped);
        if (fixed && arena_) arena_->release_region(base, length);
    }
    regions_.clear();
}

} // namespace bitship::agent
