#pragma once
// An allocator that keeps the blocks a thread lets go for that thread's next allocation of the
// same type: a call's shared state (the client's CallState, the agent's RunRequest) is made and
// let go within microseconds on the thread that progresses, so a malloc and a free per call
// (about 150 instructions, scripts/call_instructions.sh) become a pop and a push of a list.
// For std::allocate_shared, whose one block holds the object and its counts.
//
//   auto r = std::allocate_shared<RunRequest>(RecyclingAllocator<RunRequest>{});
//
// Each thread keeps at most kKept blocks of each type (more in flight at once come from the
// heap, and go back to it); a block let go on another thread than made it is kept there. A
// thread's blocks go back to the heap when it ends.

#include <cstddef>
#include <new>
#include <utility>

namespace bitship {

template <class T>
class RecyclingAllocator {
public:
    using value_type = T;
    /// Blocks of one type a thread keeps at most: a Batch of 64 calls in flight (bench/ship_rate's
    /// window) has that many call states alive at once. At most ~45 KiB a thread for CallState.
    static constexpr unsigned kKept = 64;

    RecyclingAllocator() noexcept = default;
    template <class U>
    RecyclingAllocator(const RecyclingAllocator<U>&) noexcept {} // NOLINT: allocate_shared rebinds it

    [[nodiscard]] T* allocate(std::size_t n) {
        if (n == 1 && !t_gone) {
            auto& kept = list();
            if (kept.head != nullptr) {
                Node* node = kept.head;
                kept.head = node->next;
                --kept.count;
                return reinterpret_cast<T*>(node);
            }
        }
        return static_cast<T*>(::operator new(n * sizeof(T)));
    }

    void deallocate(T* p, std::size_t n) noexcept {
        if (n == 1 && !t_gone) {
            auto& kept = list();
            if (kept.count < kKept) {
                auto* node = reinterpret_cast<Node*>(p);
                node->next = kept.head;
                kept.head = node;
                ++kept.count;
                return;
            }
        }
        ::operator delete(p);
    }

    friend bool operator==(const RecyclingAllocator&, const RecyclingAllocator&) noexcept { return true; }

private:
    static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__, "blocks come from the plain operator new");

    struct Node {
        Node* next;
    };
    static_assert(sizeof(T) >= sizeof(Node) && alignof(T) >= alignof(Node), "a kept block holds the list's link");

    struct List {
        Node* head = nullptr;
        unsigned count = 0;
        ~List() {
            // Blocks let go after this (by the thread's later thread_local destructors) go to the heap.
            t_gone = true;
            while (head != nullptr) ::operator delete(std::exchange(head, head->next));
        }
    };

    static List& list() noexcept {
        thread_local List kept;
        return kept;
    }
    /// Trivially destructible, so it is still there while the thread's other thread_locals go.
    static thread_local inline bool t_gone = false;
};

} // namespace bitship
