#include "client_impl.hpp"
#include "held_count.hpp"

#include <spdlog/spdlog.h>

namespace bitship {
namespace {

// Arguments from this size on are sent from the call's buffer, not copied into the RUN (a
// copy of a few KiB costs less than the split message's header).
constexpr std::size_t kBorrowedArgsMin = 16 << 10;

} // namespace

void Client::Impl::submit(const std::shared_ptr<CallState>& c) {
    auto it = peers.find(c->peer);
    if (it == peers.end()) {
        c->complete(fail(Errc::invalid_argument, "target does not belong to this client"));
        return;
    }
    auto& p = it->second;
    if (p.welcomed) {
        dispatch(p, c);
        return;
    }
    // Not connected (the agent went away): reconnect once for this call.
    p.waiting.push_back(c);
    if (!p.ep) {
        reconnects.fetch_add(1, std::memory_order_relaxed);
        start_connect(p);
    }
}

void Client::Impl::dispatch(Peer& p, const std::shared_ptr<CallState>& c) {
    switch (c->kind) {
    case Kind::run: send_run(p, c, false); return;
    case Kind::ping:
        engine->send(p.ep, wire::encode_ping(wire::Type::ping, c->id, c->args));
        pending[c->id] = c;
        return;
    case Kind::stats:
        engine->send(p.ep, wire::encode_stats(c->id));
        pending[c->id] = c;
        return;
    case Kind::region:
        engine->send(p.ep, wire::encode_region(c->id, c->name));
        pending[c->id] = c;
        return;
    case Kind::control: { // the request type travels in `name`'s one byte
        auto m = wire::encode_request(static_cast<wire::Type>(c->name.at(0)), c->id);
        m.payload = c->args;
        m.header.payload_size = static_cast<std::uint32_t>(m.payload.size());
        engine->send(p.ep, std::move(m));
        pending[c->id] = c;
        return;
    }
    case Kind::get:
    case Kind::put: start_rma(p, c); return;
    default: c->complete(fail(Errc::internal, "unknown call kind")); return;
    }
}

Result<SliceChoice> Client::Impl::compute_slice(const CallState& c, const Peer& p) const {
    auto view = BundleView::parse(c.bundle);
    if (!view) return tl::make_unexpected(view.error());
    std::size_t index = 0;
    bool gpu = false;
    if (c.forced_slice) {
        if (*c.forced_slice >= view->slices.size())
            return fail(Errc::invalid_argument, fmt::format("bundle has {} slices, slice {} asked for",
                                                            view->slices.size(), *c.forced_slice));
        index = *c.forced_slice;
    } else {
        // `gpu` takes the nvptx64 slice; `any` the CPU slice, else the nvptx64 one where
        // the agent has a GPU; `cpu` the CPU slice only.
        const auto cpu_slice = c.device == Device::gpu ? std::nullopt : view->find_slice(p.info->triple);
        const auto gpu_slice = view->find_slice(kGpuTriple);
        const auto gpus = p.info->capabilities.gpus;
        if (cpu_slice) {
            index = *cpu_slice;
        } else if (c.device != Device::cpu && gpu_slice && gpus > 0) {
            index = *gpu_slice;
            gpu = true;
        } else if (c.device == Device::gpu) {
            return fail(Errc::no_matching_slice,
                        fmt::format("the call asks for a GPU (ShipOptions::device = gpu): {}; {} runs {} with {} GPU(s) it "
                                    "runs kernels on",
                                    gpu_slice ? "the bundle has an nvptx64 slice"
                                              : fmt::format("the bundle has no nvptx64 slice (slices for [{}])", view->triples()),
                                    agent_name(p), p.info->triple, gpus));
        } else {
            return fail(Errc::no_matching_slice, fmt::format("bundle has slices for [{}]; {} runs {}{}", view->triples(),
                                                             agent_name(p), p.info->triple,
                                                             gpus > 0 ? fmt::format(" and {} GPU(s)", gpus) : ""));
        }
    }
    SliceChoice s;
    s.hash = view->slices[index].hash;
    s.code = std::make_shared<const Bytes>(extract_slice(*view, index));
    s.gpu = gpu;
    return s;
}

const Result<SliceChoice>& Client::Impl::choose_slice(const CallState& c, Peer& p) {
    // A kernel handle's bundle is embedded, immutable storage: its address names it, and
    // the peer's triple picks the slice, once. An explicit slice (ship_slice, tools) may come
    // from a reused buffer, so it is named by its content.
    // Looked up before anything is made: a call after the first allocates nothing here.
    Result<SliceChoice>* cached = nullptr;
    if (c.forced_slice) {
        auto key = std::pair{hash_code(c.bundle), *c.forced_slice};
        if (auto it = forced_slices.find(key); it != forced_slices.end()) return it->second;
        cached = &forced_slices.try_emplace(key, fail(Errc::internal, "slice not chosen")).first->second;
    } else {
        auto key = std::pair{static_cast<const void*>(c.bundle.data()), c.device};
        if (auto it = p.slice_by_bundle.find(key); it != p.slice_by_bundle.end()) return it->second;
        // Another agent of the same triple (and with GPUs, or not, as this one) took its slice
        // from this bundle already: the same choice, without parsing and copying the slice again
        // (about 50 us of a first call to each further agent).
        const SharedSliceKey shared{key.first, c.device, p.info->triple, p.info->capabilities.gpus > 0};
        if (auto it = slice_by_triple.find(shared); it != slice_by_triple.end())
            return p.slice_by_bundle.try_emplace(key, it->second).first->second;
        cached = &p.slice_by_bundle.try_emplace(key, fail(Errc::internal, "slice not chosen")).first->second;
        *cached = compute_slice(c, p);
        // A refusal names its agent: only choices are shared.
        if (*cached) slice_by_triple.try_emplace(shared, **cached);
        return *cached;
    }
    *cached = compute_slice(c, p);
    return *cached;
}

void Client::Impl::send_run(Peer& p, const std::shared_ptr<CallState>& c, bool with_code) {
    if (c->native) {
        c->hash = CodeHash{};
        send_run_message(p, c, {});
        return;
    }
    // A call resent after NEED_CODE holds a window slot already: a refusal gives it back.
    auto refuse = [&](Error e) {
        give_back_slot(p, *c);
        c->complete(tl::make_unexpected(std::move(e)));
    };
    const auto& choice = choose_slice(*c, p);
    if (!choice) {
        refuse(choice.error());
        return;
    }
    c->hash = choice->hash;
    c->on_gpu = choice->gpu;
    if (choice->gpu) {
        if (!c->peers.empty() || c->forward) {
            refuse(Error{Errc::invalid_argument, "a GPU call cannot forward (ShipOptions::peers or forward with the nvptx64 slice)"});
            return;
        }
        if (c->launch.device >= p.info->capabilities.gpus) {
            refuse(Error{Errc::no_device, fmt::format("the call asks for GPU {} (ShipOptions::gpu_device); {} has {}", c->launch.device,
                                                      agent_name(p), p.info->capabilities.gpus)});
            return;
        }
        if (c->launch.result_bytes > p.info->max_result) {
            refuse(Error{Errc::too_large, fmt::format("a GPU result of {} bytes exceeds {}'s limit of {}", c->launch.result_bytes,
                                                      agent_name(p), p.info->max_result)});
            return;
        }
    }
    if (c->each) {
        if (choice->gpu) {
            refuse(Error{Errc::no_matching_slice, fmt::format("the calls of a group run on the agent's CPU; the bundle has no slice "
                                                              "for {}'s {}",
                                                              agent_name(p), p.info->triple)});
            return;
        }
        if (c->each->size > p.info->max_args) {
            refuse(Error{Errc::too_large, fmt::format("{} bytes of arguments a call exceed {}'s limit of {}", c->each->size,
                                                      agent_name(p), p.info->max_args)});
            return;
        }
        if (c->args.size() > p.info->max_message) {
            refuse(Error{Errc::too_large, fmt::format("a group's {} bytes of arguments exceed {}'s message limit of {}",
                                                      c->args.size(), agent_name(p), p.info->max_message)});
            return;
        }
    } else if (c->run_args().size() > p.info->max_args) {
        refuse(Error{Errc::too_large, fmt::format("{} bytes of arguments exceed {}'s limit of {}", c->run_args().size(),
                                                  agent_name(p), p.info->max_args)});
        return;
    }
    // A call that may forward carries every slice: agents of other architectures on its way
    // get theirs from the agent before them (agents/slice_siblings.hpp). Bundles that share
    // this slice may differ in others, so which bundle went whole is kept per bundle.
    const bool travels = !c->peers.empty() || c->forward;
    auto code = travels ? c->bundle : std::span<const std::byte>(*choice->code);
    if (!p.known) p.known = &known[p.address];
    auto& known_here = travels ? known_whole[{p.address, c->bundle.data()}] : *p.known;
    with_code = with_code || !known_here.contains(c->hash);
    if (with_code && code.size() + c->run_args().size() > p.info->max_message) {
        refuse(Error{Errc::too_large, fmt::format("code ({} bytes) and arguments exceed {}'s message limit of {}",
                                                  code.size(), agent_name(p), p.info->max_message)});
        return;
    }
    send_run_message(p, c, with_code ? code : std::span<const std::byte>{});
    if (with_code) {
        add_held(bundles_sent);
        add_held(bundle_bytes_sent, code.size());
        known_here.insert(c->hash);
    }
}

void Client::Impl::send_run_message(Peer& p, const std::shared_ptr<CallState>& c, std::span<const std::byte> code) {
    wire::Run run;
    run.hash = c->hash;
    run.origin = c->id;
    run.entry = c->entry;
    run.args = c->run_args();
    run.code = code;
    run.signatures = sign_code(code, c->hash, !c->peers.empty() || c->forward);
    if (c->on_gpu) run.gpu = c->launch;
    if (!c->peers.empty() || c->forward) {
        run.reply_to = engine->worker_address();
        for (const auto& a : c->peers) run.peers.push_back(a);
        run.self_index = c->self_index;
        run.hop_budget = c->hop_budget;
    }
    if (c->each) {
        run.each = c->each; // its arguments and answers travel in the messages, never in a window
    } else {
        if (run.args.size() >= kWindowArgsMin) ask_window(p);
        offer_window(p, *c, run);
    }
    c->sent_code = !code.empty();
    // Large arguments go from the call's own buffer, which the call keeps (core/wire_split.hpp),
    // to an agent that reads split messages; an older one gets them copied into the message.
    if (run.args.size() >= kBorrowedArgsMin && p.reads_split) {
        engine->send(p.ep, wire::encode_run_borrowing_args(c->id, run, std::shared_ptr<const void>(c, run.args.data())));
        add_held(split_runs_sent);
    } else {
        auto message = wire::encode_run(c->id, run, p.reads_compact);
        if (message.header.flags & wire::kFlagCompact) add_held(compact_runs_sent);
        engine->send(p.ep, std::move(message));
    }
    add_held(runs_sent);
    pending[c->id] = c;
}
} // namespace bitship
