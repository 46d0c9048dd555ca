#pragma once
// A UCX peer that speaks the wire protocol by hand, with no client-side checks: for tests of
// what an agent does with messages no bitship client would send.

#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <bitship/identity.hpp>

#include "core/engine.hpp"
#include "core/signing.hpp"
#include "core/wire.hpp"
#include "launcher.hpp"

namespace bitship::test {

class RawPeer {
public:
    /// Connects to the agent on loopback `port`, sends HELLO and waits for WELCOME. With
    /// `authenticate`, an agent that asks for keys gets AUTH with launch::test_keys()' key,
    /// and the ACK is waited for.
    RawPeer(const std::string& transport, std::uint16_t port, bool authenticate = true) {
        EngineOptions o;
        o.transport = *parse_transport(transport);
        o.loopback_only = true;
        EngineHooks hooks;
        hooks.on_message = [this](Incoming&& in) {
            std::lock_guard lock(mutex_);
            got_.push_back(std::move(in));
            cv_.notify_all();
        };
        auto e = Engine::create(o, std::move(hooks));
        REQUIRE(e);
        engine_ = std::move(*e);
        engine_->start();
        engine_->post([this, port] {
            auto ep = engine_->connect("127.0.0.1", port);
            if (ep) {
                ep_ = *ep;
                engine_->send(ep_, wire::encode_hello("raw-peer"));
            }
        });
        auto welcome = wait(wire::Type::welcome, 0);
        REQUIRE(welcome);
        auto m = wire::decode(welcome->header, welcome->payload);
        REQUIRE(m);
        const auto& w = std::get<wire::Welcome>(m->body);
        access = w.access;
        challenge = w.challenge;
        instance = w.instance;
        if (authenticate && access == AgentAccess::keys) {
            auto id = Identity::load(launch::test_keys().secret);
            REQUIRE(id);
            send(wire::encode_auth(kAuthRequest, auth_by(*id)));
            REQUIRE(wait(wire::Type::ack, kAuthRequest));
        }
    }
    ~RawPeer() { engine_->stop(); }

    /// AUTH for this connection's challenge, signed by `who`.
    [[nodiscard]] wire::Auth auth_by(const Identity& who) const {
        return wire::Auth{who.public_key(), signing::sign_session(who, challenge, instance)};
    }

    void send(wire::Encoded e) {
        engine_->post([this, e = std::move(e)]() mutable { engine_->send(ep_, std::move(e)); });
    }

    /// The first message of `type` for `request_id`, within 10 s.
    std::optional<Incoming> wait(wire::Type type, std::uint64_t request_id) {
        std::unique_lock lock(mutex_);
        std::optional<Incoming> found;
        cv_.wait_for(lock, std::chrono::seconds(10), [&] {
            for (auto it = got_.begin(); it != got_.end(); ++it) {
                if (it->header.type == type && it->header.request_id == request_id) {
                    found = std::move(*it);
                    got_.erase(it);
                    return true;
                }
            }
            return false;
        });
        return found;
    }

    /// The ERROR answering `request_id`, decoded.
    std::pair<Errc, std::string> error_for(std::uint64_t request_id) {
        auto in = wait(wire::Type::error, request_id);
        REQUIRE(in);
        auto m = wire::decode(in->header, in->payload);
        REQUIRE(m);
        auto e = std::get<wire::ErrorMsg>(m->body);
        return {e.code, std::string(e.message)};
    }

    static constexpr std::uint64_t kAuthRequest = 1u << 30;
    AgentAccess access = AgentAccess::open;
    std::array<std::uint8_t, 32> challenge{};
    std::uint64_t instance = 0;

private:
    std::unique_ptr<Engine> engine_;
    ucp_ep_h ep_ = nullptr;
    std::mutex mutex_;
    std::condition_variable cv_;
    std::vector<Incoming> got_;
};

} // namespace bitship::test
