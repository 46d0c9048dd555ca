#include "metrics.hpp"

#include <thread>

#include <fmt/format.h>
#if BITSHIP_HAVE_HTTPLIB
#include <httplib.h>
#endif
#include <spdlog/spdlog.h>

#include "agent.hpp"

namespace bitship::agent {

namespace {

// Agent counters that are levels, not running totals: the last compile's stage times, in ns.
bool is_gauge(std::string_view counter) { return counter.starts_with("last_"); }


struct Writer {
    std::string out;
    void family(std::string_view name, std::string_view type, std::string_view help) {
        out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
    }
    template <class V> void sample(std::string_view name, std::string_view labels, V value) {
        if (labels.empty()) out += fmt::format("{} {}\n", name, value);
        else out += fmt::format("{}{{{}}} {}\n", name, labels, value);
    }
};

std::string errc_label(std::uint32_t code) {
    return code <= static_cast<std::uint32_t>(kLastErrc) ? std::string(to_string(static_cast<Errc>(code)))
                                                          : fmt::format("errc_{}", code);
}

} // namespace

std::string prometheus_label(std::string_view value) {
    std::string out;
    out.reserve(value.size());
    for (char c : value) {
        if (c == '\\') out += "\\\\";
        else if (c == '"') out += "\\\"";
        else if (c == '\n') out += "\\n";
        else out += c;
    }
    return out;
}

std::string render_prometheus(const Agent& agent) {
    Writer w;
    std::vector<std::string> storage;
    auto info = agent.info(storage);
    std::string info_labels;
    double uptime = 0;
    for (const auto& [k, v] : info.fields) {
        if (k == "uptime_s") {
            uptime = std::strtod(std::string(v).c_str(), nullptr);
            continue;
        }
        if (k == "pid") continue;
        if (!info_labels.empty()) info_labels += ",";
        info_labels += fmt::format("{}=\"{}\"", k, prometheus_label(v));
    }
    w.family("bitship_agent_info", "gauge", "What this agent is (labels); always 1.");
    w.sample("bitship_agent_info", info_labels, 1);
    w.family("bitship_agent_uptime_seconds", "gauge", "Seconds since the agent started.");
    w.sample("bitship_agent_uptime_seconds", "", uptime);

    for (const auto& [name, value] : agent.counters()) {
        if (is_gauge(name)) {
            // last_<what>_ns (a stage of the last compile, or of the last GPU code load) in seconds, as
            // Prometheus names units; other last_ values (the last compile's tier) as they are.
            const std::string_view n = name;
            const bool ns = n.ends_with("_ns");
            auto what = n.substr(5, n.size() - 5 - (ns ? 3 : 0));
            auto metric = fmt::format("bitship_agent_last_{}{}", what, ns ? "_seconds" : "");
            w.family(metric, "gauge", fmt::format("The last {} ({}).", what, ns ? "seconds" : "as the agent counts it"));
            w.sample(metric, "", ns ? value / 1e9 : static_cast<double>(value));
            continue;
        }
        auto metric = fmt::format("bitship_agent_{}_total", name);
        w.family(metric, "counter", fmt::format("xagent counter {}.", name));
        w.sample(metric, "", value);
    }

    auto stats = agent.kernel_stats();
    auto kernel_labels = [](const wire::KernelStat& k) {
        return fmt::format("hash=\"{}\",entry=\"{}\"", to_hex(k.hash, kHashDigitsInMessages), prometheus_label(k.entry));
    };
    w.family("bitship_kernel_calls_total", "counter", "Calls of a kernel this agent answered.");
    for (const auto& k : stats.kernels) w.sample("bitship_kernel_calls_total", kernel_labels(k), k.calls);
    w.family("bitship_kernel_errors_total", "counter", "Calls of a kernel answered with an error, by error code.");
    for (const auto& k : stats.kernels)
        for (const auto& e : k.errors)
            w.sample("bitship_kernel_errors_total", fmt::format("{},code=\"{}\"", kernel_labels(k), errc_label(e.code)), e.count);
    w.family("bitship_kernel_bytes_in_total", "counter", "Argument bytes of a kernel's calls.");
    for (const auto& k : stats.kernels) w.sample("bitship_kernel_bytes_in_total", kernel_labels(k), k.bytes_in);
    w.family("bitship_kernel_bytes_out_total", "counter", "Reply bytes of a kernel's successful calls.");
    for (const auto& k : stats.kernels) w.sample("bitship_kernel_bytes_out_total", kernel_labels(k), k.bytes_out);
    w.family("bitship_kernel_run_seconds", "summary",
             "Run time of a kernel on this agent (quantiles from a histogram, within 19%).");
    for (const auto& k : stats.kernels) {
        if (!k.runs) continue;
        w.sample("bitship_kernel_run_seconds", kernel_labels(k) + ",quantile=\"0.5\"", k.run_p50_ns / 1e9);
        w.sample("bitship_kernel_run_seconds", kernel_labels(k) + ",quantile=\"0.99\"", k.run_p99_ns / 1e9);
        w.sample("bitship_kernel_run_seconds_sum", kernel_labels(k), k.run_total_ns / 1e9);
        w.sample("bitship_kernel_run_seconds_count", kernel_labels(k), k.runs);
    }
    w.family("bitship_kernel_compile_seconds", "gauge", "Compile time of a kernel's code, by tier.");
    for (const auto& k : stats.kernels) {
        if (k.compile_ns_first) w.sample("bitship_kernel_compile_seconds", kernel_labels(k) + ",tier=\"first\"", k.compile_ns_first / 1e9);
        if (k.compile_ns_optimised)
            w.sample("bitship_kernel_compile_seconds", kernel_labels(k) + ",tier=\"optimised\"", k.compile_ns_optimised / 1e9);
    }
    w.family("bitship_client_calls_total", "counter", "Calls answered, by client identity.");
    for (const auto& c : stats.clients)
        w.sample("bitship_client_calls_total", fmt::format("client=\"{}\"", prometheus_label(c.client)), c.calls);
    w.family("bitship_client_errors_total", "counter", "Calls answered with an error, by client identity and error code.");
    for (const auto& c : stats.clients)
        for (const auto& e : c.errors)
            w.sample("bitship_client_errors_total",
                     fmt::format("client=\"{}\",code=\"{}\"", prometheus_label(c.client), errc_label(e.code)), e.count);
    return std::move(w.out);
}

#if BITSHIP_HAVE_HTTPLIB
struct MetricsServer::Impl {
    httplib::Server server;
    std::thread thread;
};

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(const std::string& host, std::uint16_t port,
                                                            std::function<std::string()> render) {
    auto impl = std::make_unique<Impl>();
    // Scrapes are rare and short: two threads serve them (cpp-httplib's default is eight or more).
    impl->server.new_task_queue = [] { return new httplib::ThreadPool(2); };
    impl->server.Get("/metrics", [render = std::move(render)](const httplib::Request&, httplib::Response& res) {
        res.set_content(render(), "text/plain; version=0.0.4; charset=utf-8");
    });
    impl->server.Get("/", [](const httplib::Request&, httplib::Response& res) {
        res.set_content("xagent metrics: GET /metrics\n", "text/plain");
    });
    int bound = port == 0 ? impl->server.bind_to_any_port(host) : (impl->server.bind_to_port(host, port) ? port : -1);
    if (bound <= 0)
        return fail(Errc::io_error, fmt::format("--metrics: cannot listen on {}:{} (in use, or not an address of this host)",
                                                host, port));
    impl->thread = std::thread([s = &impl->server] { s->listen_after_bind(); });
    auto p = static_cast<std::uint16_t>(bound);
    return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl), p));
}

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl, std::uint16_t port) : impl_(std::move(impl)), port_(port) {}

MetricsServer::~MetricsServer() {
    // stop() only stops a server already listening: let the thread get there first.
    for (int i = 0; i < 200 && !impl_->server.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    impl_->server.stop();
    if (impl_->thread.joinable()) impl_->thread.join();
}

#else
// Built without cpp-httplib (the aarch64 cross build: Debian has no arm64 .pc for it beside the
// amd64 one): --metrics is refused at start, saying why.
struct MetricsServer::Impl {};

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(const std::string& host, std::uint16_t port,
                                                            std::function<std::string()>) {
    return fail(Errc::invalid_argument, fmt::format("--metrics {}:{}: this xagent was built without the metrics endpoint "
                                                    "(cpp-httplib was not found when it was built)",
                                                    host, port));
}

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl, std::uint16_t port) : impl_(std::move(impl)), port_(port) {}
MetricsServer::~MetricsServer() = default;
#endif

} // namespace bitship::agent
