// libFuzzer target for what crosses the agent ⇄ bitship-compiler socket (compiler_protocol.hpp),
// both ways: the compiler's input (HELLO and COMPILE, and behind COMPILE the bundle checks and
// slice choice) and the agent's (READY, COMPILED, FAILED: a compromised compiler's reply is
// hostile bytes too). Properties checked beyond "no crash, no sanitizer report":
//   - every message that decodes encodes back to exactly the same bytes (one encoding each;
//     a FAILED with a code this build does not know decodes again to the same message);
//   - a decoded COMPILE's bundle lies inside the input;
//   - a decoded COMPILED's sizes stay within the caps; a decoded PTX_COMPILED's PTX is not empty
//     and holds no NUL.
// With BITSHIP_FUZZ_LLVM=1 in the environment, a COMPILE that decodes is also compiled in this
// process (parse, verify, code policy, allow-list, tier-0 codegen; with Sandbox::sfi's
// confine_memory when the request id is odd; or, for target ptx, compile_to_ptx without
// libdevice), as bitship-compiler would;
// LLVM 19's bitcode reader crashes on some byte-flipped slices (test/agents/crafted), which is
// why the agent runs it in a separate process: expect such crashes there, not in our code.
// Built with BITSHIP_FUZZ=ON (clang):
//   ./build-fuzz/test/jit/fuzz_compiler_input -max_total_time=60 -max_len=65536 test/jit/fuzz_compiler_corpus
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include <bitship/bundle.hpp>

#include "compile_to_object.hpp"
#include "compiler_protocol.hpp"

namespace proto = bitship::jit::compiler_protocol;

namespace {

void check(bool ok) {
    if (!ok) std::abort(); // a broken property: libFuzzer saves the input
}

template <class M> void round_trips(std::span<const std::byte> payload, const bitship::Result<M>& m) {
    if (!m) return;
    auto again = proto::encode(*m);
    check(again.size() == payload.size() && std::equal(again.begin(), again.end(), payload.begin()));
}

std::unique_ptr<bitship::jit::InProcessCompiler> make_llvm_compiler(bitship::jit::Sandbox sandbox) {
    const char* on = std::getenv("BITSHIP_FUZZ_LLVM");
    if (on == nullptr || std::string_view(on) != "1") return nullptr;
    auto c = bitship::jit::InProcessCompiler::create({"memcpy", "memmove", "memset", "bs_args", "bs_reply", "bs_fail"}, 0,
                                                     sandbox);
    return c ? std::move(*c) : nullptr;
}

bitship::jit::InProcessCompiler* llvm_compiler(bitship::jit::Sandbox sandbox) {
    static auto none = make_llvm_compiler(bitship::jit::Sandbox::none);
    static auto sfi = make_llvm_compiler(bitship::jit::Sandbox::sfi);
    return sandbox == bitship::jit::Sandbox::sfi ? sfi.get() : none.get();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const auto payload = std::as_bytes(std::span(data, size));
    auto type = proto::type_of(payload);
    if (!type) return 0;
    switch (*type) {
    case proto::Type::hello: round_trips(payload, proto::decode_hello(payload)); break;
    case proto::Type::ready: round_trips(payload, proto::decode_ready(payload)); break;
    case proto::Type::failed: {
        // A code this build does not know decodes as compile_failed: then it encodes the same
        // apart from that code.
        auto m = proto::decode_failed(payload);
        if (m) {
            auto again = proto::decode_failed(proto::encode(*m));
            check(again && again->id == m->id && again->error.code == m->error.code &&
                  again->error.message == m->error.message && again->fatal == m->fatal);
        }
        break;
    }
    case proto::Type::compiled: {
        auto m = proto::decode_compiled(payload);
        if (m) {
            check(m->made.entries.size() <= proto::kMaxEntries && !m->made.object.empty());
            check(m->made.object.size() + m->made.slice_bundle.size() < size);
        }
        round_trips(payload, m);
        break;
    }
    case proto::Type::compiled_ptx: {
        auto m = proto::decode_compiled_ptx(payload);
        if (m) {
            check(!m->made.ptx.empty() && m->made.ptx.find('\0') == std::string::npos);
            check(m->made.ptx.size() + m->made.slice_bundle.size() < size);
        }
        round_trips(payload, m);
        break;
    }
    case proto::Type::compile: {
        auto m = proto::decode_compile(payload);
        round_trips(payload, m);
        if (!m) break;
        check(m->bundle.data() >= payload.data() && m->bundle.data() + m->bundle.size() <= payload.data() + payload.size());
        // What the compiler does first with it: the container and its hashes.
        if (auto view = bitship::BundleView::parse(m->bundle))
            for (const auto& s : view->slices) (void)bitship::normalise_triple(s.triple);
        const auto sandbox = (m->id & 1) != 0 ? bitship::jit::Sandbox::sfi : bitship::jit::Sandbox::none;
        if (auto* compiler = llvm_compiler(sandbox)) {
            if (m->target == proto::Target::ptx) (void)compiler->compile_ptx(m->bundle, m->expected, m->sm);
            else (void)compiler->compile(m->bundle, m->expected, m->tier, m->only);
        }
        break;
    }
    }
    return 0;
}
