#include "loopback_client.hpp"

#include <stdexcept>

namespace bitship::bench {

Transport transport_named(const std::string& name) {
    auto t = parse_transport(name);
    if (!t) throw std::runtime_error(t.error().describe());
    return *t;
}

ProgressMode progress_named(const std::string& name) {
    auto mode = parse_progress_mode(name);
    if (!mode) throw std::runtime_error(mode.error().describe());
    return *mode;
}

Client loopback_client(Transport transport, const std::string& progress) {
    ClientOptions o;
    o.transport = transport;
    o.loopback_only = true;
    o.progress = progress_named(progress);
    auto client = Client::create(o);
    if (!client) throw std::runtime_error(client.error().describe());
    return std::move(*client);
}

Target connect_or_throw(Client& client, const std::string& address) {
    auto target = client.connect(address);
    if (!target) throw std::runtime_error(target.error().describe());
    return *target;
}

} // namespace bitship::bench
