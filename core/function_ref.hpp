#pragma once
// A callable borrowed for the length of one call: what std::function is for a parameter that is
// only ever called before the function returns, without the heap allocation std::function
// makes for a lambda that captures more than two pointers. Private to bitship (core, agents).
//
//   void each(FunctionRef<void(int)> fn) { fn(1); fn(2); }
//   each([&](int i) { total += i * scale; });
//
// It must not outlive the callable it was made from (never store one).

#include <memory>
#include <type_traits>
#include <utility>

namespace bitship {

template <class Signature> class FunctionRef;

template <class R, class... Args> class FunctionRef<R(Args...)> {
public:
    template <class F>
        requires(!std::is_same_v<std::remove_cvref_t<F>, FunctionRef> && std::is_invocable_r_v<R, F&, Args...>)
    FunctionRef(F&& f) noexcept // NOLINT(google-explicit-constructor): stands in for std::function
        : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
          call_([](void* object, Args... args) -> R {
              return (*static_cast<std::remove_reference_t<F>*>(object))(std::forward<Args>(args)...);
          }) {}

    R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

private:
    void* object_;
    R (*call_)(void*, Args...);
};

} // namespace bitship
