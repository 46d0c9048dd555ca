// The operator's view of a live agent: xctl (info, stats, cache, drain) and the Prometheus
// endpoint, checked against what a client observed; the config file and BITSHIP_* variables.

#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <bitship/client.hpp>
#include <behaviour_kernels.hpp>

#include "launcher.hpp"
#include "test_support.hpp"

namespace control_test_cpp {

using namespace bitship;
using bitship::launch::AgentProcess;
using json = nlohmann::json;
using namespace std::chrono_literals;

using Output = bitship::test::CommandOutput;

namespace {

using bitship::test::xctl_json;
Output run(const std::string& command) { return bitship::test::run_command(command); }

Client make_client() {
    ClientOptions o;
    o.transport = Transport::tcp;
    o.loopback_only = true;
    o.call_timeout = 30s;
    auto c = Client::create(o);
    REQUIRE(c);
    return std::move(*c);
}

const json* kernel_entry(const json& stats, std::string_view entry) {
    for (const auto& k : stats["kernels"])
        if (k["entry"] == entry) return &k;
    return nullptr;
}

// A Prometheus text-format (0.0.4) parser, strict enough to catch a malformed exposition:
// every sample line is NAME{LABELS} VALUE with a valid name, well-quoted labels and a number,
// and every sample belongs to a family declared by # TYPE before it.
std::map<std::string, double> parse_prometheus(const std::string& text) {
    static const std::regex sample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*")(,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*")*\})? ([-+0-9.eE]+|NaN|[+-]Inf)$)");
    static const std::regex type(R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|summary|histogram|untyped)$)");
    std::map<std::string, double> out;
    std::set<std::string> families;
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
        std::smatch m;
        if (line.rfind("# HELP ", 0) == 0) continue;
        if (std::regex_match(line, m, type)) {
            families.insert(m[1]);
            continue;
        }
        INFO("line: " << line);
        REQUIRE(std::regex_match(line, m, sample));
        std::string name = m[1];
        for (std::string suffix : {"_sum", "_count"}) // a summary's series
            if (!families.contains(name) && name.ends_with(suffix)) name.resize(name.size() - suffix.size());
        CHECK(families.contains(name));
        auto key = line.substr(0, line.rfind(' '));
        CHECK_FALSE(out.contains(key)); // no duplicate series
        out[key] = std::stod(m[m.size() - 1]);
    }
    return out;
}

double series(const std::map<std::string, double>& metrics, const std::string& name, const std::string& must_contain) {
    for (const auto& [k, v] : metrics)
        if (k.rfind(name + "{", 0) == 0 && k.find(must_contain) != std::string::npos) return v;
    return -1;
}

} // namespace

TEST_CASE("xctl stats --json counts exactly the calls and errors a client saw", "[integration]") {
    AgentProcess agent("tcp", {"--workers", "1"});
    auto client = make_client();
    auto target = client.connect(agent.address());
    REQUIRE(target);
    constexpr int kAdds = 7, kFails = 3, kMissing = 2;
    std::map<Errc, int> seen;
    for (int i = 0; i < kAdds; ++i) {
        auto r = client.ship(behaviour_kernels::add, *target, std::uint64_t{1}, std::uint64_t{2}).get_as<std::uint64_t>();
        REQUIRE(r);
        CHECK(*r == 3);
    }
    for (int i = 0; i < kFails; ++i) {
        auto r = client.ship(behaviour_kernels::fail_with_42, *target).get();
        REQUIRE_FALSE(r);
        ++seen[r.error().code];
    }
    Kernel missing{behaviour_kernels::add.bundle, "no_such_entry"};
    for (int i = 0; i < kMissing; ++i) {
        auto r = client.ship(missing, *target).get();
        REQUIRE_FALSE(r);
        ++seen[r.error().code];
    }
    REQUIRE(seen[Errc::kernel_failed] == kFails);
    REQUIRE(seen[Errc::entry_not_found] == kMissing);

    auto stats = xctl_json(agent, "stats");
    INFO(stats.dump(2) << agent.log());
    REQUIRE(stats["ok"] == true);
    CHECK(stats["exit_status"] == 0);
    const auto* add = kernel_entry(stats, "add");
    const auto* fail = kernel_entry(stats, "fail_with_42");
    const auto* none = kernel_entry(stats, "no_such_entry");
    REQUIRE(add);
    REQUIRE(fail);
    REQUIRE(none);
    CHECK((*add)["calls"] == kAdds);
    CHECK((*add)["errors"].empty());
    CHECK((*add)["runs"] == kAdds);
    CHECK((*add)["bytes_in"] == kAdds * 16);
    CHECK((*add)["bytes_out"] == kAdds * 8);
    CHECK((*add)["compile_ms"]["first"].get<double>() > 0);
    CHECK((*add)["run_us"]["p50"].get<double>() > 0);
    CHECK((*add)["run_us"]["p99"].get<double>() >= (*add)["run_us"]["p50"].get<double>());
    CHECK((*fail)["calls"] == kFails);
    CHECK((*fail)["errors"]["kernel_failed"] == seen[Errc::kernel_failed]);
    CHECK((*none)["calls"] == kMissing);
    CHECK((*none)["errors"]["entry_not_found"] == seen[Errc::entry_not_found]);
    CHECK((*none)["runs"] == 0);
    // The same hash for all three entries: one bundle.
    CHECK((*add)["hash"] == (*fail)["hash"]);

    // Per client: this test's client, by the identity it gave in HELLO.
    auto me = fmt::format("bitship-client pid {}", getpid());
    const json* mine = nullptr;
    for (const auto& c : stats["clients"])
        if (c["client"] == me) mine = &c;
    REQUIRE(mine);
    CHECK((*mine)["calls"] == kAdds + kFails + kMissing);
    CHECK((*mine)["errors"]["kernel_failed"] == kFails);
    CHECK((*mine)["errors"]["entry_not_found"] == kMissing);
}

TEST_CASE("xctl info says what the agent is, ping answers, cache list and evict reach the JIT", "[integration]") {
    AgentProcess agent("tcp", {"--workers", "1"});
    auto info = xctl_json(agent, "info");
    INFO(info.dump(2));
    REQUIRE(info["ok"] == true);
    CHECK(info["triple"].get<std::string>().rfind("x86_64", 0) == 0);
    CHECK(info["workers"] == "1");
    CHECK(info["llvm"].get<std::string>().rfind("19.", 0) == 0);
    CHECK(std::stoi(info["cores"].get<std::string>()) >= 1);
    CHECK(std::stoi(info["numa_nodes"].get<std::string>()) >= 1);
    CHECK(info["gpus"] == "0"); // from WELCOME's capabilities: no GPU path yet
    CHECK(info["sandbox"].get<std::string>().starts_with("sfi (arena 64 GiB at 0x"));
    // No CUDA driver on a test machine without a GPU; its GPUs where there is one.
    CHECK_THAT(info["cuda"], Catch::StartsWith("no CUDA driver: ") || Catch::StartsWith("driver "));
    CHECK(info["trust"] == "keys (1 authorized; signed code only)"); // the launcher's test key
    CHECK(info["pid"] == std::to_string(agent.pid()));

    auto ping = xctl_json(agent, "ping --count 5");
    CHECK(ping["ok"] == true);
    CHECK(ping["pings"] == 5);

    auto empty = xctl_json(agent, "cache list");
    INFO(empty.dump(2));
    REQUIRE(empty["ok"] == true);
    CHECK(empty["cache"].empty());
    {
        auto client = make_client();
        auto target = client.connect(agent.address());
        REQUIRE(target);
        REQUIRE(client.ship(behaviour_kernels::add, *target, std::uint64_t{1}, std::uint64_t{2}).get());
    }
    auto one = xctl_json(agent, "cache list");
    INFO(one.dump(2));
    REQUIRE(one["ok"] == true);
    REQUIRE(one["cache"].size() == 1);
    CHECK(one["cache"][0]["memory_bytes"].get<std::uint64_t>() > 0);
    CHECK(one["cache"][0]["disk_bytes"] == 0); // no --cache-dir
    const auto hash = one["cache"][0]["hash"].get<std::string>();
    auto evicted = xctl_json(agent, "cache evict " + hash);
    INFO(evicted.dump(2));
    CHECK(evicted["ok"] == true);
    CHECK(evicted["done"] == true);
    CHECK(xctl_json(agent, "cache list")["cache"].empty());
    CHECK(xctl_json(agent, "cache evict " + hash)["done"] == false);

    auto bad = run(fmt::format("{} --agent {} --loopback cache evict 12ab 2>&1", BITSHIP_XCTL, agent.address()));
    CHECK(bad.status == 2);
    CHECK_THAT(bad.text, Catch::Contains("64 hex digits"));

    auto nobody = run(fmt::format("{} --agent 127.0.0.1:{} --loopback --timeout-ms 500 --json info", BITSHIP_XCTL,
                                  launch::free_port()));
    CHECK(nobody.status == 1);
    CHECK_THAT(nobody.text, Catch::Contains("connect_failed"));
}

TEST_CASE("xctl drain: new calls are refused, the call in flight finishes, then the agent exits", "[integration]") {
    AgentProcess agent("tcp", {"--workers", "1", "--kernel-timeout-ms", "1000"});
    auto client = make_client();
    auto target = client.connect(agent.address());
    REQUIRE(target);
    REQUIRE(client.ship(behaviour_kernels::add, *target, std::uint64_t{1}, std::uint64_t{1}).get());
    auto in_flight = client.ship(behaviour_kernels::spin_forever, *target); // stopped at 1 s by the budget
    std::this_thread::sleep_for(200ms);
    auto drain = xctl_json(agent, "drain");
    REQUIRE(drain["ok"] == true);
    CHECK(drain["done"] == true);
    auto refused = client.ship(behaviour_kernels::add, *target, std::uint64_t{1}, std::uint64_t{1}).get();
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == Errc::shutting_down);
    CHECK_THAT(refused.error().message, Catch::Contains("draining"));
    auto finished = in_flight.get();
    REQUIRE_FALSE(finished);
    CHECK(finished.error().code == Errc::kernel_timeout); // answered, not dropped
    auto status = bitship::test::wait_for_exit(agent);
    INFO(agent.log());
    REQUIRE(status);
    CHECK(WIFEXITED(*status));
    CHECK(WEXITSTATUS(*status) == 0);
    CHECK_THAT(agent.log(), Catch::Contains("drained"));
}

TEST_CASE("a Prometheus scrape of a live agent parses and its counters move with calls", "[integration]") {
    auto port = launch::free_port();
    AgentProcess agent("tcp", {"--workers", "1", "--metrics", fmt::format("127.0.0.1:{}", port)});
    auto client = make_client();
    auto target = client.connect(agent.address());
    REQUIRE(target);
    httplib::Client http("127.0.0.1", port);
    http.set_connection_timeout(5);
    http.set_read_timeout(5);
    auto scrape = [&] {
        auto res = http.Get("/metrics");
        REQUIRE(res);
        CHECK(res->status == 200);
        CHECK_THAT(res->get_header_value("Content-Type"), Catch::Contains("text/plain; version=0.0.4"));
        return res->body;
    };
    for (int i = 0; i < 3; ++i) REQUIRE(client.ship(behaviour_kernels::add, *target, std::uint64_t{1}, std::uint64_t{2}).get());
    REQUIRE_FALSE(client.ship(behaviour_kernels::fail_with_42, *target).get());
    auto before_text = scrape();
    auto before = parse_prometheus(before_text);
    INFO(before_text);
    CHECK(series(before, "bitship_kernel_calls_total", "entry=\"add\"") == 3);
    CHECK(series(before, "bitship_kernel_errors_total", "entry=\"fail_with_42\",code=\"kernel_failed\"") == 1);
    CHECK(before.at("bitship_agent_runs_total") == 4);
    CHECK(series(before, "bitship_agent_info", "triple=\"x86_64") == 1);

    for (int i = 0; i < 5; ++i) REQUIRE(client.ship(behaviour_kernels::add, *target, std::uint64_t{1}, std::uint64_t{2}).get());
    auto after = parse_prometheus(scrape());
    CHECK(series(after, "bitship_kernel_calls_total", "entry=\"add\"") == 8);
    CHECK(after.at("bitship_agent_runs_total") == 9);
    CHECK(series(after, "bitship_client_calls_total", fmt::format("client=\"bitship-client pid {}\"", getpid())) == 9);

    // Debian's promtool, where installed, agrees the exposition is well formed.
    if (std::system("command -v promtool >/dev/null 2>&1") == 0) {
        auto dir = launch::make_temp_dir("bitship-metrics-");
        std::ofstream(dir / "metrics.txt") << before_text;
        auto check = run(fmt::format("promtool check metrics < {} 2>&1", (dir / "metrics.txt").string()));
        INFO(check.text);
        CHECK(check.status == 0);
        std::filesystem::remove_all(dir);
    } else {
        WARN("promtool not installed: the exposition was checked by this test's parser only");
    }
}

TEST_CASE("every option can come from a config file, common ones from BITSHIP_* variables", "[integration]") {
    auto dir = launch::make_temp_dir("bitship-config-");
    auto metrics_port = launch::free_port();
    std::ofstream(dir / "xagent.toml") << fmt::format(
        "# xagent configuration\nworkers = 1\nregion = [\"chase=1M\"]\nmetrics = \"127.0.0.1:{}\"\n", metrics_port);
    {
        AgentProcess agent("tcp", {"--config", (dir / "xagent.toml").string()});
        auto info = xctl_json(agent, "info");
        CHECK(info["workers"] == "1");
        httplib::Client http("127.0.0.1", metrics_port);
        auto scraped = http.Get("/metrics");
        REQUIRE(scraped);
        CHECK(scraped->status == 200);
        auto client = make_client();
        auto target = client.connect(agent.address());
        REQUIRE(target);
        auto region = client.region(*target, "chase");
        REQUIRE(region);
        CHECK(region->size == 1u << 20);
    }
    {
        setenv("BITSHIP_WORKERS", "3", 1);
        AgentProcess agent("tcp", {});
        unsetenv("BITSHIP_WORKERS");
        CHECK(xctl_json(agent, "info")["workers"] == "3");
    }
    {
        // The command line wins over the file.
        AgentProcess agent("tcp", {"--config", (dir / "xagent.toml").string(), "--workers", "2"});
        CHECK(xctl_json(agent, "info")["workers"] == "2");
    }
    std::ofstream(dir / "bad.toml") << "no_such_option = 3\n";
    auto bad = run(fmt::format("timeout 20 {} --listen 127.0.0.1:0 --config {} 2>&1", launch::AgentProcess::binary(),
                               (dir / "bad.toml").string()));
    CHECK(bad.status != 0);
    CHECK_THAT(bad.text, Catch::Contains("no_such_option"));
    std::filesystem::remove_all(dir);
}

TEST_CASE("a client repeating a failing call gets a few log lines, not one per call", "[integration]") {
    AgentProcess agent("tcp", {"--workers", "1"});
    auto client = make_client();
    auto target = client.connect(agent.address());
    REQUIRE(target);
    constexpr int kCalls = 40;
    auto began = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i) {
        auto r = client.ship(behaviour_kernels::fail_with_42, *target).get();
        REQUIRE_FALSE(r);
        CHECK(r.error().code == Errc::kernel_failed); // every caller still hears of it
    }
    // Each 10 s window allows 5 lines: bound by the windows the calls actually spanned.
    auto windows = 1 + static_cast<std::size_t>((std::chrono::steady_clock::now() - began) / 10s) + 1;
    auto log = agent.log();
    std::size_t lines = 0;
    for (auto at = log.find("kernel_failed: kernel 'fail_with_42'"); at != std::string::npos;
         at = log.find("kernel_failed: kernel 'fail_with_42'", at + 1))
        ++lines;
    INFO(log);
    CHECK(lines >= 1);
    CHECK(lines <= 5 * windows); // LogLimiter::kBurst per window, far fewer than kCalls
    CHECK(lines < static_cast<std::size_t>(kCalls));
}

}  // namespace control_test_cpp
