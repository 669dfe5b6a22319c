// Sandbox states and the transitions between them, in one place.
//
//   creating --create ok--> running --delete--> deleting --> deleted
//      |                      |   ^                 ^  |
//      |          pause ok /  |   | wake ok         |  |
//      |        suspend ok    v   |                 |  |
//      |                 paused | suspended --delete+  |
//      |                                               |
//      +--create failed--> failed --delete-------------+--destroy failed--> failed
//   any state but deleted --delete--> deleting (delete wins over in-flight work)
//
// A pause, suspend or wake operation leaves the state as it is while it runs (the sandbox's
// current_operation_id names it) and moves it only when it succeeds. After an sbxd restart an
// interrupted one is failed and the state is taken from the kernel: frozen -> paused (or the
// stored paused/suspended), not frozen -> running.
//
// The operations a client starts on an existing sandbox (delete, pause, suspend, wake) are
// data below: kVerbs says how each meets an operation in flight, kTransitions what each does
// in each state. sandbox_state_test.cc checks every state x verb.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string_view>

namespace sbx::service {

inline constexpr std::string_view kCreating = "creating";
inline constexpr std::string_view kRunning = "running";
inline constexpr std::string_view kPaused = "paused";
inline constexpr std::string_view kSuspended = "suspended";
inline constexpr std::string_view kFailed = "failed";
inline constexpr std::string_view kDeleting = "deleting";
inline constexpr std::string_view kDeleted = "deleted";
// Its node stopped heartbeating (docs/scale.md): nothing of it can be reached; it holds nothing
// and can only be deleted.
inline constexpr std::string_view kLost = "lost";

// Every state, in the order of the rows of kTransitions.
inline constexpr std::array<std::string_view, 8> kStates = {
    kCreating, kRunning, kPaused, kSuspended, kFailed, kDeleting, kDeleted, kLost};

// Every state but deleted (deleted rows are kept for good): what sbx_sandboxes reports.
inline constexpr std::string_view kLiveStates[] = {kCreating, kRunning,  kPaused, kSuspended,
                                                   kFailed,   kDeleting, kLost};

inline constexpr std::optional<size_t> StateIndex(std::string_view s) {
  for (size_t i = 0; i < kStates.size(); ++i) {
    if (kStates[i] == s) return i;
  }
  return std::nullopt;
}

inline bool IsSandboxState(std::string_view s) { return StateIndex(s).has_value(); }

// Paused and suspended sandboxes are frozen: their processes exist but do not run.
inline bool IsFrozenState(std::string_view s) { return s == kPaused || s == kSuspended; }

// The operations that act on an existing sandbox, in the order of the columns of kTransitions.
enum class Verb { kDelete, kPause, kSuspend, kWake };

struct VerbRules {
  Verb verb;
  std::string_view name;  // the operation's kind
  // Whether it overtakes another operation in flight (it is queued behind it, and the other
  // sees the new state when it finishes); if not, another kind in flight refuses it with
  // operation_in_progress. A repeat of the same kind in flight returns that operation.
  bool overtakes;
  // Whether the sandbox's runtime must have Capabilities::pause (not_implemented otherwise).
  bool needs_pause;
  // Why a state refuses it, the end of the invalid_state message.
  std::string_view refused_because;
};

inline constexpr std::array<VerbRules, 4> kVerbs = {{
    {Verb::kDelete, "delete", true, false, ""},
    {Verb::kPause, "pause", false, true, "only a running sandbox can be paused or suspended"},
    {Verb::kSuspend, "suspend", false, true, "only a running sandbox can be paused or suspended"},
    {Verb::kWake, "wake", false, true, "only a paused or suspended sandbox wakes"},
}};

inline constexpr const VerbRules& RulesOf(Verb v) { return kVerbs[static_cast<size_t>(v)]; }

inline constexpr std::optional<Verb> VerbNamed(std::string_view name) {
  for (const VerbRules& r : kVerbs) {
    if (r.name == name) return r.verb;
  }
  return std::nullopt;
}

// What a verb does to a sandbox in one state when no operation of its kind is in flight.
struct Transition {
  enum class Answer {
    kStart,   // a new operation
    kDone,    // already done: answered with the last operation of the kind that succeeded
    kRefuse,  // refused with `error`
  };
  Answer answer;
  std::string_view during;  // the state while the operation runs ("": unchanged)
  std::string_view after;   // the state when it succeeds ("" unless kStart)
  std::string_view error;   // the API error code (kRefuse only)
};

namespace transitions {
inline constexpr Transition kDelete{Transition::Answer::kStart, kDeleting, kDeleted, ""};
inline constexpr Transition kDeletedAlready{Transition::Answer::kDone, "", "", ""};
inline constexpr Transition kPause{Transition::Answer::kStart, "", kPaused, ""};
inline constexpr Transition kSuspend{Transition::Answer::kStart, "", kSuspended, ""};
inline constexpr Transition kWake{Transition::Answer::kStart, "", kRunning, ""};
inline constexpr Transition kInvalid{Transition::Answer::kRefuse, "", "", "invalid_state"};
}  // namespace transitions

// Rows: kStates; columns: Verb.
inline constexpr Transition kTransitions[kStates.size()][kVerbs.size()] = {
    //             delete                        pause                  suspend
    //             wake
    /* creating */ {transitions::kDelete, transitions::kInvalid, transitions::kInvalid,
                    transitions::kInvalid},
    /* running  */ {transitions::kDelete, transitions::kPause, transitions::kSuspend,
                    transitions::kInvalid},
    /* paused   */ {transitions::kDelete, transitions::kInvalid, transitions::kInvalid,
                    transitions::kWake},
    /* suspended*/ {transitions::kDelete, transitions::kInvalid, transitions::kInvalid,
                    transitions::kWake},
    /* failed   */ {transitions::kDelete, transitions::kInvalid, transitions::kInvalid,
                    transitions::kInvalid},
    /* deleting */ {transitions::kDelete, transitions::kInvalid, transitions::kInvalid,
                    transitions::kInvalid},
    /* deleted  */ {transitions::kDeletedAlready, transitions::kInvalid, transitions::kInvalid,
                    transitions::kInvalid},
    /* lost     */ {transitions::kDelete, transitions::kInvalid, transitions::kInvalid,
                    transitions::kInvalid},
};

// The transition of `verb` from `state`; a state the store should never hold refuses.
inline constexpr Transition TransitionOf(std::string_view state, Verb verb) {
  const std::optional<size_t> row = StateIndex(state);
  if (!row) return transitions::kInvalid;
  return kTransitions[*row][static_cast<size_t>(verb)];
}

// What sbxd does at start-up with a sandbox stored in each state (SandboxService::Reconcile).
enum class OnRestart {
  kAdopt,          // running or frozen: re-adopted from the runtime, or failed (sandbox_lost)
  kFail,           // creating: failed (create_failed), the build was interrupted
  kRedriveDelete,  // deleting: its delete runs again
  kKeep,           // failed, deleted: as they are
  kRelease,        // lost: kept as it is in the store; what the node still holds of it goes
};

inline constexpr OnRestart OnRestartOf(std::string_view state) {
  if (state == kRunning || IsFrozenState(state)) return OnRestart::kAdopt;
  if (state == kCreating) return OnRestart::kFail;
  if (state == kDeleting) return OnRestart::kRedriveDelete;
  if (state == kLost) return OnRestart::kRelease;
  return OnRestart::kKeep;
}

}  // namespace sbx::service
