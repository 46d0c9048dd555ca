// GpuProcess (gpu_process.hpp): the agent's end of a bitship-gpu process.
#include "gpu_process.hpp"

#include "core/child_process.hpp"
#include "core/frame_io.hpp"
#include "gpu_process_protocol.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <fmt/format.h>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <spdlog/spdlog.h>
#include <unistd.h>

namespace bitship::agent {
namespace proto = gpu_protocol;
namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kProgramName = "bitship-gpu";
constexpr std::string_view kPeer = "GPU process";
/// cuInit, the primary context and the staging buffers: well under a second on an H100 host;
/// generous for a loaded machine.
constexpr auto kStartTimeout = std::chrono::seconds(60);
/// Any request but a launch: a module load or a transfer of at most kMaxTransfer bytes.
constexpr auto kRequestTimeout = std::chrono::seconds(120);
/// A launch's answer may come this long after the kernel's own timeout (the process's wait
/// notices it, answers, exits) before the process counts as hung and is stopped.
constexpr auto kLaunchAnswerGrace = std::chrono::seconds(10);
/// How long the agent polls for an answer before it sleeps on the socket: a GPU call that ends
/// within it (a pass over a few GiB of GPU memory) skips a wake-up of the agent's thread. As
/// long as the GPU process spins on its stream.
constexpr auto kAnswerSpin = std::chrono::milliseconds(5);
/// How long a process whose socket broke gets to end by itself before it is stopped.
constexpr auto kLostGrace = std::chrono::milliseconds(1000);
/// How long a process gets to exit by itself: after a poisoned answer (it exits at once), and
/// when the agent closes its socket (it tears its context down).
constexpr auto kExitGrace = std::chrono::milliseconds(5000);

} // namespace

struct GpuProcess::Impl {
    Options options;
    std::string where; ///< "GPU 0"
    proto::Ready info; ///< the first process's READY: constant afterwards

    mutable std::mutex mutex;
    /// Made once, passed to every process; shared with the read leases (read_in_window), so a
    /// read slot stays mapped while a send still reads it, even past this object.
    std::shared_ptr<const proto::Window> window;
    /// The window's control part (launches, and reads and writes that copy), under `mutex`.
    [[nodiscard]] std::span<std::byte> control() const noexcept { return window->bytes().first(proto::kWindowBytes); }
    /// Which read slots are free (bit i: slot i), shared with the leases that give them back.
    struct ReadSlots {
        std::mutex mutex;
        std::uint32_t free = (1u << proto::kReadSlots) - 1;
    };
    std::shared_ptr<ReadSlots> read_slots = std::make_shared<ReadSlots>();
    ChildProcess child;                  ///< pid -1 when none runs
    std::vector<GpuDevice::RegionView> regions;
    struct Kept {
        std::string ptx;
        std::uint64_t used = 0; ///< `uses` at its last load or launch
    };
    std::map<CodeHash, Kept> modules; ///< every module kept, with its PTX
    std::set<CodeHash> loaded;        ///< those the current process has loaded
    std::uint64_t uses = 0;
    std::atomic<std::uint64_t> evictions{0};
    std::atomic<std::uint64_t> restarts{0};
    /// abort(): the process's pid while one runs and is not yet being reaped (-1 otherwise),
    /// under its own lock (abort() cannot take `mutex`: the launch it ends holds that), so a
    /// pid is signalled only before it is reaped, never after it could be another process's.
    std::mutex pid_mutex;
    pid_t running_pid = -1;
    std::atomic<bool> aborted{false};
    void set_running_pid(pid_t pid) {
        std::lock_guard lock(pid_mutex);
        running_pid = pid;
        if (pid > 0 && aborted.load()) ::kill(pid, SIGKILL); // abort() came while this one started
    }

    ~Impl() {
        std::lock_guard lock(mutex);
        stop(kExitGrace);
    }

    /// Ends the process (closing its socket first: a healthy one exits by itself) and says how
    /// it ended: "" for a clean exit.
    std::string stop(std::chrono::milliseconds grace) {
        if (child.fd >= 0) ::close(child.fd);
        child.fd = -1;
        loaded.clear();
        if (child.pid < 0) return {};
        set_running_pid(-1); // before the reaping
        const ChildEnd end = end_child(child.pid, grace);
        child.pid = -1;
        if (!end.known) return "its exit status is unknown";
        if (end.exited)
            return end.status == 0 ? "" : fmt::format("it exited with status {}", end.status);
        if (end.killed_by_us) return "it was stopped";
        return fmt::format("it was killed by {}", signal_name(end.signal));
    }

    /// A new process, READY, with the regions allocated again. Sets `info` the first time; a
    /// later process must report the same GPU.
    Result<void> begin(bool first) {
        std::vector<std::string> argv = {options.program.string(), "--ordinal",
                                         std::to_string(options.ordinal)};
        if (!options.cuda_library.empty())
            argv.insert(argv.end(), {"--cuda-library", options.cuda_library});
        static_assert(proto::kWindowFd == proto::kProcessFd + 1);
        auto spawned = spawn_with_socket(argv, proto::kProcessFd, {window->fd()});
        if (!spawned) return tl::make_unexpected(spawned.error());
        child = *spawned;
        set_running_pid(child.pid);
        auto frame = read_frame(child.fd, proto::kMaxFrame, kPeer, Clock::now() + kStartTimeout);
        auto failed = [&](const std::string& why) {
            auto ended = stop(std::chrono::milliseconds(0));
            return fail(Errc::no_device,
                        fmt::format("{}: the GPU process did not start: {}{}", where, why,
                                    ended.empty() ? "" : " (" + ended + ")"));
        };
        if (!frame) return failed(frame.error().message);
        if (auto type = proto::type_of(*frame); type && *type == proto::Type::failed) {
            auto f = proto::decode_failed(*frame);
            return failed(f ? f->error.message : f.error().message);
        }
        auto ready = proto::decode_ready(*frame);
        if (!ready) return failed(ready.error().message);
        if (first) {
            info = std::move(*ready);
        } else if (ready->gpu.name != info.gpu.name ||
                   ready->gpu.pci_bus_id != info.gpu.pci_bus_id) {
            return failed(fmt::format("it opened {} ({}) where the agent had {} ({})",
                                      ready->gpu.name, ready->gpu.pci_bus_id, info.gpu.name,
                                      info.gpu.pci_bus_id));
        }
        for (const auto& r : regions) {
            auto added = request(proto::encode(proto::AddRegion{r.name, r.size}),
                                 Clock::now() + kRequestTimeout);
            if (!added)
                return failed(fmt::format("region '{}' ({} bytes): {}", r.name, r.size,
                                          added.error().message));
        }
        return {};
    }

    struct Answer {
        std::vector<std::byte> frame; ///< OK
    };
    struct Trouble {
        Error error;
        bool ended = false; ///< the process is gone: restart it
    };
    /// Sends `frame` and reads the answer: OK's frame, or FAILED's error. A poisoned FAILED,
    /// a lost socket or a missed deadline ends the process (the caller restarts it).
    /// `on_hang`: the error code when the deadline passes.
    tl::expected<Answer, Trouble> exchange(std::span<const std::byte> frame,
                                           Clock::time_point deadline, Errc on_hang) {
        // A process that hung is stopped at once; one whose socket broke is most likely ending
        // already, and gets a moment to, so that its error says how it ended.
        auto gone = [&](Errc code, std::string why, std::chrono::milliseconds grace = kLostGrace) {
            auto ended = stop(grace);
            return tl::make_unexpected(
                Trouble{Error{code, fmt::format("{}: {}{}", where, why,
                                                ended.empty() ? "" : " (" + ended + ")")},
                        true});
        };
        if (auto sent = write_frame(child.fd, frame, kPeer); !sent)
            return gone(Errc::internal, sent.error().message);
        spin_until_readable(child.fd, kAnswerSpin);
        auto reply = read_frame(child.fd, proto::kMaxFrame, kPeer, deadline);
        if (!reply) {
            if (reply.error().code == Errc::timeout)
                return gone(on_hang, "the GPU process did not answer in time and was stopped",
                            std::chrono::milliseconds(0));
            return gone(Errc::internal,
                        fmt::format("the GPU process was lost: {}", reply.error().message));
        }
        auto type = proto::type_of(*reply);
        if (!type) return gone(Errc::internal, type.error().message);
        if (*type == proto::Type::ok) return Answer{std::move(*reply)};
        if (*type != proto::Type::failed)
            return gone(Errc::internal, fmt::format("the GPU process answered with message type {}",
                                                    static_cast<int>(*type)));
        auto failed = proto::decode_failed(*reply);
        if (!failed) return gone(Errc::internal, failed.error().message);
        if (!failed->poisoned) return tl::make_unexpected(Trouble{std::move(failed->error), false});
        // Its last word: it exits right after.
        auto ended = stop(kExitGrace);
        if (!ended.empty()) failed->error.message += fmt::format(" (the GPU process: {})", ended);
        return tl::make_unexpected(Trouble{std::move(failed->error), true});
    }

    /// exchange() for a request whose OK carries nothing of interest, without restarting.
    Result<void> request(std::span<const std::byte> frame, Clock::time_point deadline) {
        auto answer = exchange(frame, deadline, Errc::internal);
        if (!answer) return tl::make_unexpected(answer.error().error);
        return {};
    }

    /// Another process in place of one that ended (counted as a restart), or why none starts.
    Result<void> restart() {
        if (auto r = begin(false); !r) return r;
        restarts.fetch_add(1, std::memory_order_relaxed);
        return {};
    }

    /// After the process ended: another, and what the failed call's message adds.
    std::string restart_and_say() {
        if (auto r = restart(); !r)
            return fmt::format("; recreating the context in a new GPU process failed ({}): the "
                               "GPU is unusable until a later call recreates it",
                               r.error().message);
        return std::string("; the context was recreated in a new GPU process") +
               (regions.empty() ? ""
                                : ", GPU regions were allocated again (their contents are lost)");
    }

    /// The start of every call: a process to talk to (started again if an earlier restart
    /// failed).
    Result<void> ready() {
        if (aborted.load()) return fail(Errc::shutting_down, fmt::format("{}: the agent is shutting down", where));
        if (child.pid >= 0) return {};
        if (auto r = restart(); !r)
            return fail(Errc::no_device,
                        fmt::format("{} is unusable: its context could not be recreated: {}", where,
                                    r.error().message));
        return {};
    }

    /// A request of a call: its OK frame, or its error; a process that ended is restarted
    /// and the error says so.
    Result<std::vector<std::byte>> call(std::span<const std::byte> frame,
                                        Clock::time_point deadline, Errc on_hang) {
        if (auto r = ready(); !r) return tl::make_unexpected(r.error());
        auto answer = exchange(frame, deadline, on_hang);
        if (answer) return std::move(answer->frame);
        Error error = std::move(answer.error().error);
        if (aborted.load())
            return fail(Errc::shutting_down,
                        fmt::format("{}: the agent is shutting down, and stopped its GPU process ({})", where,
                                    error.message));
        if (answer.error().ended) error.message += restart_and_say();
        return tl::make_unexpected(std::move(error));
    }

    /// READ of `length` bytes of region `name` at `offset` into the window at `at`: done when it
    /// returns, all of them (with `mutex` held).
    Result<void> read_to_window(std::string_view name, std::uint64_t offset, std::uint64_t length, std::uint64_t at) {
        auto r = call(proto::encode_read({std::string(name), offset, length, at}), Clock::now() + kRequestTimeout,
                      Errc::internal);
        if (!r) return tl::make_unexpected(r.error());
        auto bytes = proto::decode_ok(*r);
        if (!bytes) return tl::make_unexpected(bytes.error());
        if (*bytes != length)
            return fail(Errc::internal,
                        fmt::format("{}: the GPU process returned {} bytes of a read of {}", where, *bytes, length));
        return {};
    }

    /// Loads module `hash` in the current process, from its kept PTX, unless it has.
    Result<void> ensure_loaded(const CodeHash& hash) {
        if (loaded.contains(hash)) return {};
        auto m = modules.find(hash);
        if (m == modules.end())
            return fail(Errc::code_missing,
                        fmt::format("{}: module {} is not loaded (unloaded to make room for others, "
                                    "or never loaded)", where, to_hex(hash, 12)));
        auto r = call(proto::encode(proto::LoadModule{hash, m->second.ptx}),
                      Clock::now() + kRequestTimeout, Errc::internal);
        if (!r) return tl::make_unexpected(r.error());
        loaded.insert(hash);
        return {};
    }

    /// Unloads the least recently used module until fewer than max_modules are kept. An unload
    /// that fails (the process lost: it restarts) still drops the module: a new process loads
    /// only what is launched.
    void make_room() {
        while (!modules.empty() && modules.size() >= std::max<std::size_t>(options.max_modules, 1)) {
            auto victim = std::min_element(modules.begin(), modules.end(),
                                           [](const auto& a, const auto& b) { return a.second.used < b.second.used; });
            const CodeHash hash = victim->first;
            if (loaded.erase(hash) > 0) {
                auto r = call(proto::encode(proto::UnloadModule{hash}), Clock::now() + kRequestTimeout,
                              Errc::internal);
                if (!r) spdlog::warn("{}: unloading module {}: {}", where, to_hex(hash, 12), r.error().describe());
            }
            modules.erase(hash);
            evictions.fetch_add(1, std::memory_order_relaxed);
            spdlog::info("{}: unloaded module {} to make room ({} kept at most: xagent --gpu-modules)", where,
                         to_hex(hash, 12), options.max_modules);
        }
    }

    const GpuDevice::RegionView* find_region(std::string_view name) const {
        auto it = std::find_if(regions.begin(), regions.end(),
                               [&](const auto& r) { return r.name == name; });
        return it == regions.end() ? nullptr : &*it;
    }
};

Result<std::filesystem::path> GpuProcess::find_program(const std::filesystem::path& configured) {
    std::filesystem::path program = configured;
    if (program.empty()) {
        std::error_code ec;
        auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
        if (ec)
            return fail(Errc::io_error, fmt::format("cannot read /proc/self/exe to find {}: {}",
                                                    kProgramName, ec.message()));
        program = self.parent_path() / kProgramName;
    }
    if (::access(program.c_str(), X_OK) != 0)
        return fail(Errc::io_error,
                    fmt::format("no GPU program at {} ({}): give its path (xagent --gpu-program)",
                                program.string(), std::strerror(errno)));
    return program;
}

Result<std::unique_ptr<GpuProcess>> GpuProcess::start(Options options) {
    auto impl = std::make_unique<Impl>();
    impl->where = fmt::format("GPU {}", options.ordinal);
    impl->options = std::move(options);
    auto window = proto::Window::create();
    if (!window) return tl::make_unexpected(window.error());
    impl->window = std::make_shared<const proto::Window>(std::move(*window));
    std::lock_guard lock(impl->mutex);
    if (auto r = impl->begin(true); !r) return tl::make_unexpected(r.error());
    return std::unique_ptr<GpuProcess>(new GpuProcess(std::move(impl)));
}

GpuProcess::GpuProcess(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuProcess::~GpuProcess() = default;

int GpuProcess::ordinal() const noexcept {
    return impl_->options.ordinal;
}
const GpuInfo& GpuProcess::info() const noexcept {
    return impl_->info.gpu;
}

GpuGeometry GpuProcess::geometry_for(const CodeHash& hash, std::string_view entry) const {
    std::lock_guard lock(impl_->mutex);
    auto m = impl_->modules.find(hash);
    return m == impl_->modules.end() ? default_geometry(impl_->info.gpu.limits)
                                     : launch_geometry(impl_->info.gpu.limits, m->second.ptx, entry);
}

Result<void> GpuProcess::add_region(const std::string& name, std::uint64_t size) {
    std::lock_guard lock(impl_->mutex);
    if (impl_->find_region(name) != nullptr)
        return fail(Errc::invalid_argument,
                    fmt::format("{}: there is a region '{}' already", impl_->where, name));
    auto r = impl_->call(proto::encode(proto::AddRegion{name, size}),
                         Clock::now() + kRequestTimeout, Errc::internal);
    if (!r) return tl::make_unexpected(r.error());
    impl_->regions.push_back(GpuDevice::RegionView{name, size, impl_->regions.size()});
    return {};
}

std::optional<GpuDevice::RegionView> GpuProcess::region(std::string_view name) const {
    std::lock_guard lock(impl_->mutex);
    const auto* r = impl_->find_region(name);
    if (r == nullptr) return std::nullopt;
    return *r;
}

std::vector<GpuDevice::RegionView> GpuProcess::regions() const {
    std::lock_guard lock(impl_->mutex);
    return impl_->regions;
}

bool GpuProcess::has_module(const CodeHash& hash) const {
    std::lock_guard lock(impl_->mutex);
    return impl_->modules.contains(hash);
}

Result<void> GpuProcess::load_module(const CodeHash& hash, const std::string& ptx) {
    std::lock_guard lock(impl_->mutex);
    if (impl_->modules.contains(hash)) return {};
    impl_->make_room();
    auto r = impl_->call(proto::encode(proto::LoadModule{hash, ptx}),
                         Clock::now() + kRequestTimeout, Errc::internal);
    if (!r) return tl::make_unexpected(r.error());
    impl_->modules.emplace(hash, Impl::Kept{ptx, ++impl_->uses});
    impl_->loaded.insert(hash);
    return {};
}

Result<Bytes> GpuProcess::launch(const CodeHash& hash, std::string_view entry,
                                 std::span<const std::byte> args, std::uint32_t result_bytes,
                                 const GpuGeometry& geometry, std::chrono::milliseconds timeout) {
    std::lock_guard lock(impl_->mutex);
    auto window = impl_->control();
    if (args.size() > window.size() || result_bytes > window.size())
        return fail(
            Errc::too_large,
            fmt::format("{}: a GPU call's arguments ({} bytes) and result ({} bytes) must each fit "
                        "the GPU process's window of {} bytes",
                        impl_->where, args.size(), result_bytes, window.size()));
    if (auto r = impl_->ensure_loaded(hash); !r)
        return tl::make_unexpected(r.error()); // starts one if none runs
    impl_->modules.at(hash).used = ++impl_->uses;
    proto::Launch m;
    m.hash = hash;
    m.entry = std::string(entry);
    m.geometry = geometry;
    m.result_bytes = result_bytes;
    m.timeout = timeout;
    m.args_bytes = args.size();
    std::memcpy(window.data(), args.data(), args.size());
    // A timeout of a year stands for "never" (--kernel-timeout-ms 0): no deadline past it.
    const auto deadline = timeout > std::chrono::hours(24 * 365 - 1)
                              ? Clock::time_point::max()
                              : Clock::now() + timeout + kLaunchAnswerGrace;
    auto out = impl_->call(proto::encode(m), deadline, Errc::kernel_timeout);
    if (!out) return tl::make_unexpected(out.error());
    auto bytes = proto::decode_ok(*out);
    if (!bytes) return tl::make_unexpected(bytes.error());
    if (*bytes != result_bytes)
        return fail(Errc::internal,
                    fmt::format("{}: the GPU process returned {} result bytes for {}", impl_->where,
                                *bytes, result_bytes));
    return Bytes(window.begin(), window.begin() + static_cast<std::ptrdiff_t>(result_bytes));
}

// Reads and writes go through the window in pieces of at most its size (a zero-length one still
// asks the process, which checks the range).
Result<Bytes> GpuProcess::read(std::string_view name, std::uint64_t offset, std::uint64_t length) {
    std::lock_guard lock(impl_->mutex);
    auto window = impl_->control();
    Bytes out;
    out.reserve(length);
    std::uint64_t done = 0;
    do {
        const std::uint64_t n = std::min<std::uint64_t>(window.size(), length - done);
        if (auto r = impl_->read_to_window(name, offset + done, n, 0); !r) return tl::make_unexpected(r.error());
        out.insert(out.end(), window.begin(), window.begin() + static_cast<std::ptrdiff_t>(n));
        done += n;
    } while (done < length);
    return out;
}

Result<void> GpuProcess::write(std::string_view name, std::uint64_t offset,
                               std::span<const std::byte> in) {
    std::lock_guard lock(impl_->mutex);
    auto window = impl_->control();
    std::uint64_t done = 0;
    do {
        const std::uint64_t n = std::min<std::uint64_t>(window.size(), in.size() - done);
        std::memcpy(window.data(), in.data() + done, n);
        auto r = impl_->call(proto::encode_write({std::string(name), offset + done, n}),
                             Clock::now() + kRequestTimeout, Errc::internal);
        if (!r) return tl::make_unexpected(r.error());
        done += n;
    } while (done < in.size());
    return {};
}

Result<std::optional<GpuProcess::WindowRead>> GpuProcess::read_in_window(std::string_view name, std::uint64_t offset,
                                                                         std::uint64_t length) {
    if (length == 0 || length > proto::kReadSlotBytes) return std::optional<WindowRead>{};
    unsigned slot = 0;
    {
        std::lock_guard lock(impl_->read_slots->mutex);
        auto& free = impl_->read_slots->free;
        if (free == 0) return std::optional<WindowRead>{};
        slot = static_cast<unsigned>(std::countr_zero(free));
        free &= ~(1u << slot);
    }
    // From here the slot is the lease's: it goes back when the last holder drops it.
    std::shared_ptr<const void> lease(nullptr, [slots = impl_->read_slots, window = impl_->window, slot](const void*) {
        std::lock_guard lock(slots->mutex);
        slots->free |= 1u << slot;
    });
    const std::uint64_t at = proto::kWindowBytes + std::uint64_t{slot} * proto::kReadSlotBytes;
    std::lock_guard lock(impl_->mutex);
    if (auto r = impl_->read_to_window(name, offset, length, at); !r) return tl::make_unexpected(r.error());
    return std::optional<WindowRead>{WindowRead{impl_->window->bytes().subspan(at, length), std::move(lease)}};
}

std::uint64_t GpuProcess::module_evictions() const noexcept {
    return impl_->evictions.load(std::memory_order_relaxed);
}

void GpuProcess::abort() noexcept {
    std::lock_guard lock(impl_->pid_mutex);
    impl_->aborted.store(true);
    if (impl_->running_pid > 0) ::kill(impl_->running_pid, SIGKILL);
}

std::uint64_t GpuProcess::restarts() const noexcept {
    return impl_->restarts.load(std::memory_order_relaxed);
}

} // namespace bitship::agent
