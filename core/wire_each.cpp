// A group's answers in one RESULT (wire::EachResultsWriter, index_each_results): what an agent
// writes after running every call of a kFlagEach RUN, and what Client::ship_each reads.
#include "wire.hpp"

#include <fmt/format.h>

namespace bitship::wire {
namespace {
constexpr std::uint8_t kAnswerResult = 0;
constexpr std::uint8_t kAnswerError = 1;

tl::unexpected<Error> cut_short(std::uint32_t call, std::uint32_t count) {
    return tl::make_unexpected(
        Error{Errc::malformed_message, fmt::format("a group's RESULT ends inside the answer of call {} of {}", call, count)});
}
} // namespace

EachResultsWriter::EachResultsWriter(std::uint32_t count, std::size_t reserve_bytes) {
    w_.reserve(sizeof count + reserve_bytes);
    w_.u32(count);
}

void EachResultsWriter::result(std::span<const std::byte> bytes) {
    w_.u8(kAnswerResult);
    w_.blob32(bytes);
}

void EachResultsWriter::error(Errc code, std::int32_t kernel_code, std::string_view message) {
    w_.u8(kAnswerError);
    w_.u32(static_cast<std::uint32_t>(code));
    w_.u32(static_cast<std::uint32_t>(kernel_code));
    w_.str16(message);
}

Result<std::vector<std::uint32_t>> index_each_results(std::span<const std::byte> bytes, std::uint32_t expected) {
    if (bytes.size() > 0xffffffffu)
        return fail(Errc::malformed_message, fmt::format("a group's RESULT of {} bytes is over 4 GiB", bytes.size()));
    ByteReader in(bytes);
    auto count = in.u32();
    if (!count) return fail(Errc::malformed_message, "a group's RESULT has no call count");
    if (*count != expected)
        return fail(Errc::malformed_message,
                    fmt::format("a group's RESULT answers {} calls; the group had {}", *count, expected));
    // Each answer takes at least 5 bytes: refuse counts the bytes cannot hold before reserving.
    if (*count > in.remaining() / 5) return cut_short(0, *count);
    std::vector<std::uint32_t> at;
    at.reserve(*count);
    for (std::uint32_t i = 0; i < *count; ++i) {
        at.push_back(static_cast<std::uint32_t>(bytes.size() - in.remaining()));
        auto outcome = in.u8();
        if (!outcome) return cut_short(i, *count);
        if (*outcome == kAnswerResult) {
            if (!in.blob32()) return cut_short(i, *count);
        } else if (*outcome == kAnswerError) {
            if (!in.u32() || !in.u32() || !in.str16()) return cut_short(i, *count);
        } else {
            return fail(Errc::malformed_message,
                        fmt::format("a group's RESULT has an unknown outcome {} for call {}", *outcome, i));
        }
    }
    if (in.remaining() != 0)
        return fail(Errc::malformed_message,
                    fmt::format("a group's RESULT has {} bytes after its {} answers", in.remaining(), *count));
    return at;
}

EachAnswer read_each_answer(std::span<const std::byte> bytes, std::uint32_t at) noexcept {
    ByteReader in(bytes.subspan(at));
    EachAnswer a;
    if (in.u8().value_or(kAnswerError) == kAnswerResult) {
        a.bytes = in.blob32().value_or(std::span<const std::byte>{});
        return a;
    }
    ErrorMsg e;
    auto code = in.u32().value_or(static_cast<std::uint32_t>(Errc::internal));
    e.code = code > static_cast<std::uint32_t>(kLastErrc) ? Errc::internal : static_cast<Errc>(code);
    e.kernel_code = static_cast<std::int32_t>(in.u32().value_or(0));
    e.message = in.str16().value_or(std::string_view{});
    a.error = e;
    return a;
}

} // namespace bitship::wire
