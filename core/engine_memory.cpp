// Registered memory and one-sided RMA: regions allocated and registered (private huge pages, or
// UCX shared memory a same-host peer maps), remote keys, and GET/PUT whose completions the
// progress loop reports. Part of Engine; the progress loop itself is engine.cpp.
#include "engine.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

namespace bitship {

std::string page_size_of(const void* base, pid_t pid) {
    auto smaps = pid == 0 ? std::string("/proc/self/smaps") : fmt::format("/proc/{}/smaps", pid);
    std::FILE* f = std::fopen(smaps.c_str(), "r");
    if (!f) return "unknown page size";
    char line[512];
    bool inside = false;
    std::uint64_t huge_kb = 0, kernel_page_kb = 0;
    auto want = reinterpret_cast<std::uintptr_t>(base);
    while (std::fgets(line, sizeof line, f)) {
        unsigned long lo = 0, hi = 0;
        if (std::sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && std::strchr(line, '-') < std::strchr(line, ' ')) {
            if (inside) break;
            inside = want >= lo && want < hi;
            continue;
        }
        if (!inside) continue;
        unsigned long kb = 0;
        if (std::sscanf(line, "AnonHugePages: %lu kB", &kb) == 1 || std::sscanf(line, "ShmemPmdMapped: %lu kB", &kb) == 1 ||
            std::sscanf(line, "FilePmdMapped: %lu kB", &kb) == 1)
            huge_kb += kb;
        if (std::sscanf(line, "KernelPageSize: %lu kB", &kb) == 1) kernel_page_kb = kb;
    }
    std::fclose(f);
    if (kernel_page_kb >= 2048) return fmt::format("{} KiB pages (hugetlb)", kernel_page_kb);
    if (huge_kb > 0) return fmt::format("2 MiB transparent huge pages ({} MiB of them)", huge_kb / 1024);
    return "4 KiB pages";
}

namespace {
// The bracketed choice of a sysfs setting ("always [advise] never" -> "advise").
std::string sysfs_choice(const char* path) {
    std::FILE* f = std::fopen(path, "r");
    if (!f) return "unknown";
    char line[256] = {};
    bool read = std::fgets(line, sizeof line, f) != nullptr;
    std::fclose(f);
    const char* open = read ? std::strchr(line, '[') : nullptr;
    const char* close = open ? std::strchr(open, ']') : nullptr;
    return close ? std::string(open + 1, close) : "unknown";
}

long hugetlb_pages_free() {
    std::FILE* f = std::fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    long free = 0;
    while (std::fgets(line, sizeof line, f))
        if (std::sscanf(line, "HugePages_Free: %ld", &free) == 1) break;
    std::fclose(f);
    return free;
}

constexpr const char* kShmemThp = "/sys/kernel/mm/transparent_hugepage/shmem_enabled";
} // namespace

std::string shared_huge_pages() {
    return fmt::format("transparent huge pages for shared memory: {}; hugetlb pages free: {}", sysfs_choice(kShmemThp),
                       hugetlb_pages_free());
}

bool shared_huge_pages_off() {
    auto thp = sysfs_choice(kShmemThp);
    return thp != "advise" && thp != "always" && thp != "within_size" && thp != "force" && hugetlb_pages_free() == 0;
}

Result<Engine::Mapped> Engine::map_memory(std::size_t size, RegionMemory memory, void* at, Touch touch) {
    constexpr std::size_t kHuge = 2u << 20;
    std::size_t length = (size + kHuge - 1) / kHuge * kHuge;
    Mapped m;
    if (memory == RegionMemory::shared) {
        // UCX allocates it from a shared-memory domain (sysv/posix), so a peer on this host can
        // map it (ucp_rkey_ptr) and read it by plain loads. Huge pages only where the kernel
        // gives them to shared memory (transparent_hugepage/shmem_enabled).
        ucp_mem_map_params_t params{};
        params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
        params.address = at;
        params.length = length;
        params.flags = UCP_MEM_MAP_ALLOCATE | (at ? static_cast<unsigned>(UCP_MEM_MAP_FIXED) : 0u);
        if (auto s = ucp_mem_map(context_.get(), &params, &m.memh); s != UCS_OK)
            return tl::make_unexpected(from_ucs(s, fmt::format("allocating {} bytes of shared memory", size)));
        ucp_mem_attr_t attr{};
        attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
        if (auto s = ucp_mem_query(m.memh, &attr); s != UCS_OK) {
            ucp_mem_unmap(context_.get(), m.memh);
            return tl::make_unexpected(from_ucs(s, "ucp_mem_query"));
        }
        m.base = attr.address;
        m.mapped_length = attr.length;
        m.ucx_allocated = true;
        m.fixed = at != nullptr;
        if (at && attr.address != at) {
            ucp_mem_unmap(context_.get(), m.memh);
            return fail(Errc::internal, fmt::format("UCX placed shared memory at {}, not at {} as asked", attr.address, at));
        }
        madvise(m.base, m.mapped_length, MADV_HUGEPAGE); // a hint
        // Touched now, not during the first timed walk. (A new shared-memory segment is zero
        // already: skipping this only moves the page faults to first use.)
        if (touch == Touch::now) std::memset(m.base, 0, m.mapped_length);
    } else {
        // Our own anonymous mapping, 2 MiB aligned and marked for transparent huge pages:
        // kernels walk regions at random, and with 4 KiB pages every hop of a chase is a TLB
        // miss too.
        void* base = nullptr;
        if (at) {
            // Over the caller's reservation, atomically: the range is never free meanwhile.
            base = mmap(at, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
            if (base == MAP_FAILED)
                return fail(Errc::too_large, fmt::format("cannot map {} bytes at {}: {}", size, at, std::strerror(errno)));
            m.fixed = true;
        } else {
            void* raw = mmap(nullptr, length + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (raw == MAP_FAILED) return fail(Errc::too_large, fmt::format("cannot map {} bytes: {}", size, std::strerror(errno)));
            auto addr = reinterpret_cast<std::uintptr_t>(raw);
            auto aligned = (addr + kHuge - 1) / kHuge * kHuge;
            // Trim the unaligned head and tail so munmap(base, length) releases exactly what is left.
            if (aligned > addr) munmap(raw, aligned - addr);
            if (auto tail = addr + length + kHuge - (aligned + length); tail > 0)
                munmap(reinterpret_cast<void*>(aligned + length), tail);
            base = reinterpret_cast<void*>(aligned);
        }
        madvise(base, length, MADV_HUGEPAGE); // a hint: without THP the region still works
        std::memset(base, 0, length);
        ucp_mem_map_params_t params{};
        params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
        params.address = base;
        params.length = length;
        if (auto s = ucp_mem_map(context_.get(), &params, &m.memh); s != UCS_OK) {
            if (!m.fixed) munmap(base, length);
            return tl::make_unexpected(from_ucs(s, fmt::format("registering {} bytes", size)));
        }
        m.base = base;
        m.mapped_length = length;
    }
    m.size = size;
    m.pages = page_size_of(m.base);
    void* packed = nullptr;
    std::size_t packed_size = 0;
    if (auto s = ucp_rkey_pack(context_.get(), m.memh, &packed, &packed_size); s != UCS_OK) {
        unmap_memory(m);
        return tl::make_unexpected(from_ucs(s, "ucp_rkey_pack"));
    }
    auto* first = static_cast<const std::byte*>(packed);
    m.packed_rkey.assign(first, first + packed_size);
    ucp_rkey_buffer_release(packed);
    return m;
}

void Engine::unmap_memory(Mapped& m) {
    if (m.memh) ucp_mem_unmap(context_.get(), m.memh); // frees it too when UCX allocated it
    if (m.base && !m.ucx_allocated && !m.fixed) munmap(m.base, m.mapped_length);
    m = Mapped{};
}

void* Engine::rkey_ptr(ucp_rkey_h rkey, std::uint64_t remote) const noexcept {
    void* local = nullptr;
    return ucp_rkey_ptr(rkey, remote, &local) == UCS_OK ? local : nullptr;
}

Result<ucp_rkey_h> Engine::unpack_rkey(ucp_ep_h ep, std::span<const std::byte> packed) {
    ucp_rkey_h rkey = nullptr;
    if (auto s = ucp_ep_rkey_unpack(ep, packed.data(), &rkey); s != UCS_OK)
        return tl::make_unexpected(from_ucs(s, "unpacking a remote key"));
    return rkey;
}

void Engine::on_rma_done(void* request, ucs_status_t status, void* user_data) noexcept {
    auto* record = static_cast<std::pair<Engine*, RmaDone>*>(user_data);
    try {
        record->first->rma_done_.push_back({std::move(record->second), status});
    } catch (...) {
    }
    delete record;
    ucp_request_free(request);
}

void Engine::rma(bool is_get, ucp_ep_h ep, ucp_rkey_h rkey, std::uint64_t remote, void* local, std::size_t length, RmaDone done) {
    auto* record = new std::pair<Engine*, RmaDone>(this, std::move(done));
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.send = &Engine::on_rma_done;
    rp.user_data = record;
    auto* req = is_get ? ucp_get_nbx(ep, local, length, remote, rkey, &rp) : ucp_put_nbx(ep, local, length, remote, rkey, &rp);
    if (req == nullptr || UCS_PTR_IS_ERR(req)) {
        // Completed at once (or failed): report from the loop, never from inside this call.
        rma_done_.push_back({std::move(record->second), req == nullptr ? UCS_OK : UCS_PTR_STATUS(req)});
        delete record;
    }
}

void Engine::get(ucp_ep_h ep, ucp_rkey_h rkey, std::uint64_t remote, void* local, std::size_t length, RmaDone done) {
    rma(true, ep, rkey, remote, local, length, std::move(done));
}

void Engine::put(ucp_ep_h ep, ucp_rkey_h rkey, std::uint64_t remote, const void* local, std::size_t length, RmaDone done) {
    rma(false, ep, rkey, remote, const_cast<void*>(local), length, std::move(done));
}

} // namespace bitship
