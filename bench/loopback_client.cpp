#include "loopback_client.hpp"

#include <stdexcept>

namespace bitship::bench {

Client loopback_client(Transport transport, const std::string& progress) {
    auto mode = parse_progress_mode(progress);
    if (!mode) throw std::runtime_error(mode.error().describe());
    ClientOptions o;
    o.transport = transport;
    o.loopback_only = true;
    o.progress = *mode;
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
