#include "pmix_launch.hpp"

#include <cstdlib>
#include <cstring>
#include <mutex>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#if BITSHIP_HAVE_PMIX
#include <pmix.h>
#endif

namespace bitship::agent {

bool launched_by_pmix() { return std::getenv("PMIX_NAMESPACE") != nullptr; }

unsigned launcher_task_count() {
    for (const char* name : {"SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
        if (const char* v = std::getenv(name)) {
            char* end = nullptr;
            auto n = std::strtoul(v, &end, 10);
            if (end != v && *end == '\0' && n < (1u << 24)) return static_cast<unsigned>(n);
        }
    }
    return 0;
}

#if BITSHIP_HAVE_PMIX

namespace {

// Keys every agent publishes. Values are strings or a uint32.
constexpr const char* kKeyAddress = "bitship.address";
constexpr const char* kKeyHost = "bitship.host";
constexpr const char* kKeyTriple = "bitship.triple";
constexpr const char* kKeyGpus = "bitship.gpus";

std::string status_text(pmix_status_t s) { return fmt::format("{} ({})", PMIx_Error_string(s), static_cast<int>(s)); }

// PMIx delivers events to a plain C callback: the one handler of this process lives here.
std::mutex g_lost_mutex;
std::function<void()> g_on_lost;

void on_event(size_t, pmix_status_t status, const pmix_proc_t*, pmix_info_t[], size_t, pmix_info_t*, size_t,
              pmix_event_notification_cbfunc_fn_t cbfunc, void* cbdata) {
    spdlog::debug("PMIx event {}", status_text(status));
    {
        std::lock_guard lock(g_lost_mutex);
        if (g_on_lost && (status == PMIX_ERR_LOST_CONNECTION || status == PMIX_ERR_UNREACH)) g_on_lost();
    }
    if (cbfunc) cbfunc(PMIX_EVENT_ACTION_COMPLETE, nullptr, 0, nullptr, nullptr, cbdata);
}

Result<void> put_string(const char* key, const std::string& value) {
    pmix_value_t v;
    PMIX_VALUE_CONSTRUCT(&v);
    v.type = PMIX_STRING;
    v.data.string = const_cast<char*>(value.c_str()); // PMIx_Put copies it
    auto rc = PMIx_Put(PMIX_GLOBAL, key, &v);
    if (rc != PMIX_SUCCESS) return fail(Errc::io_error, fmt::format("PMIx_Put({}): {}", key, status_text(rc)));
    return {};
}

// PMIx_Get of one rank's key; the value is released here, its contents copied out.
template <class F> Result<void> get_value(const pmix_proc_t& proc, const char* key, F&& use) {
    pmix_value_t* v = nullptr;
    auto rc = PMIx_Get(&proc, key, nullptr, 0, &v);
    if (rc != PMIX_SUCCESS || !v)
        return fail(Errc::io_error, fmt::format("PMIx_Get({}) of rank {}: {}", key, proc.rank, status_text(rc)));
    auto ok = use(*v);
    PMIX_VALUE_RELEASE(v);
    if (!ok) return fail(Errc::io_error, fmt::format("PMIx_Get({}) of rank {}: unexpected value type", key, proc.rank));
    return {};
}

Result<std::string> get_string(const pmix_proc_t& proc, const char* key) {
    std::string out;
    auto r = get_value(proc, key, [&](const pmix_value_t& v) {
        if (v.type != PMIX_STRING || !v.data.string) return false;
        out = v.data.string;
        return true;
    });
    if (!r) return tl::make_unexpected(r.error());
    return out;
}

Result<std::uint32_t> get_u32(const pmix_proc_t& proc, const char* key) {
    std::uint32_t out = 0;
    auto r = get_value(proc, key, [&](const pmix_value_t& v) {
        if (v.type == PMIX_UINT32) out = v.data.uint32;
        else if (v.type == PMIX_UINT64) out = static_cast<std::uint32_t>(v.data.uint64);
        else if (v.type == PMIX_INT) out = static_cast<std::uint32_t>(v.data.integer);
        else return false;
        return true;
    });
    if (!r) return tl::make_unexpected(r.error());
    return out;
}

} // namespace

Result<std::unique_ptr<PmixJob>> PmixJob::init() {
    if (!launched_by_pmix()) return std::unique_ptr<PmixJob>();
    pmix_proc_t me;
    auto rc = PMIx_Init(&me, nullptr, 0);
    if (rc != PMIX_SUCCESS)
        return fail(Errc::connect_failed,
                    fmt::format("PMIX_NAMESPACE is set (started by a PMIx launcher) but PMIx_Init failed: {}; the launcher's "
                                "PMIx server is not reachable",
                                status_text(rc)));
    std::unique_ptr<PmixJob> job(new PmixJob());
    job->nspace_ = me.nspace;
    job->rank_ = me.rank;
    pmix_proc_t wildcard;
    PMIX_LOAD_PROCID(&wildcard, me.nspace, PMIX_RANK_WILDCARD);
    auto size = get_u32(wildcard, PMIX_JOB_SIZE);
    if (!size) return tl::make_unexpected(size.error()); // ~PmixJob finalizes
    job->size_ = *size;
    if (job->rank_ >= job->size_)
        return fail(Errc::internal, fmt::format("PMIx says this is rank {} of a job of {}", job->rank_, job->size_));
    return job;
}

PmixJob::~PmixJob() {
    spdlog::debug("PMIx_Finalize");
    {
        std::lock_guard lock(g_lost_mutex);
        g_on_lost = nullptr;
    }
    auto rc = PMIx_Finalize(nullptr, 0);
    spdlog::debug("PMIx_Finalize: {}", status_text(rc));
}

Result<std::vector<PeerRecord>> PmixJob::exchange(const PeerRecord& mine) {
    // 1. Publish what the other agents need to reach and describe us.
    for (auto [key, value] : {std::pair{kKeyAddress, &mine.address}, {kKeyHost, &mine.host}, {kKeyTriple, &mine.triple}})
        if (auto r = put_string(key, *value); !r) return tl::make_unexpected(r.error());
    pmix_value_t gpus;
    PMIX_VALUE_CONSTRUCT(&gpus);
    gpus.type = PMIX_UINT32;
    gpus.data.uint32 = mine.gpus;
    if (auto rc = PMIx_Put(PMIX_GLOBAL, kKeyGpus, &gpus); rc != PMIX_SUCCESS)
        return fail(Errc::io_error, fmt::format("PMIx_Put({}): {}", kKeyGpus, status_text(rc)));
    if (auto rc = PMIx_Commit(); rc != PMIX_SUCCESS) return fail(Errc::io_error, fmt::format("PMIx_Commit: {}", status_text(rc)));

    // 2. One fence over the whole job, collecting the data, so the reads below are local.
    pmix_proc_t all;
    PMIX_LOAD_PROCID(&all, nspace_.c_str(), PMIX_RANK_WILDCARD);
    pmix_info_t collect;
    PMIX_INFO_CONSTRUCT(&collect);
    bool yes = true;
    PMIX_INFO_LOAD(&collect, PMIX_COLLECT_DATA, &yes, PMIX_BOOL);
    auto rc = PMIx_Fence(&all, 1, &collect, 1);
    PMIX_INFO_DESTRUCT(&collect);
    if (rc != PMIX_SUCCESS) return fail(Errc::io_error, fmt::format("PMIx_Fence: {}", status_text(rc)));

    // 3. Every rank's record, in rank order.
    std::vector<PeerRecord> peers(size_);
    for (std::uint32_t r = 0; r < size_; ++r) {
        pmix_proc_t proc;
        PMIX_LOAD_PROCID(&proc, nspace_.c_str(), r);
        auto address = get_string(proc, kKeyAddress);
        auto host = get_string(proc, kKeyHost);
        auto triple = get_string(proc, kKeyTriple);
        auto n_gpus = get_u32(proc, kKeyGpus);
        for (const auto* e : {address ? nullptr : &address.error(), host ? nullptr : &host.error(),
                              triple ? nullptr : &triple.error(), n_gpus ? nullptr : &n_gpus.error()})
            if (e) return tl::make_unexpected(*e);
        peers[r] = PeerRecord{r, *address, *host, *triple, *n_gpus};
    }
    return peers;
}

Result<void> PmixJob::on_launcher_lost(std::function<void()> on_lost) {
    {
        std::lock_guard lock(g_lost_mutex);
        g_on_lost = std::move(on_lost);
    }
    pmix_status_t codes[] = {PMIX_ERR_LOST_CONNECTION, PMIX_ERR_UNREACH};
    // Registration completes through a callback; the blocking form (no callback) returns the
    // handler's id or an error.
    auto rc = PMIx_Register_event_handler(codes, 2, nullptr, 0, on_event, nullptr, nullptr);
    if (rc < 0) return fail(Errc::io_error, fmt::format("PMIx_Register_event_handler: {}", status_text(rc)));
    return {};
}

#else // built without PMIx

Result<std::unique_ptr<PmixJob>> PmixJob::init() {
    if (!launched_by_pmix()) return std::unique_ptr<PmixJob>();
    return fail(Errc::invalid_argument, "PMIX_NAMESPACE is set (started by a PMIx launcher) but this xagent was built "
                                        "without PMIx (install libpmix-dev and rebuild), so it cannot find its peers");
}

PmixJob::~PmixJob() = default;

Result<std::vector<PeerRecord>> PmixJob::exchange(const PeerRecord&) {
    return fail(Errc::invalid_argument, "built without PMIx");
}

Result<void> PmixJob::on_launcher_lost(std::function<void()>) { return fail(Errc::invalid_argument, "built without PMIx"); }

#endif

} // namespace bitship::agent
