#include "service/sandbox_state.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>

#include <string>

namespace sbx::service {
namespace {

using Answer = Transition::Answer;

// Every state x verb, written out: a change to the rules shows up here as a row to change.
struct Row {
  std::string_view state;
  Verb verb;
  Answer answer;
  std::string_view during, after, error;
};

constexpr Row kExpected[] = {
    {kCreating, Verb::kDelete, Answer::kStart, kDeleting, kDeleted, ""},
    {kCreating, Verb::kPause, Answer::kRefuse, "", "", "invalid_state"},
    {kCreating, Verb::kSuspend, Answer::kRefuse, "", "", "invalid_state"},
    {kCreating, Verb::kWake, Answer::kRefuse, "", "", "invalid_state"},

    {kRunning, Verb::kDelete, Answer::kStart, kDeleting, kDeleted, ""},
    {kRunning, Verb::kPause, Answer::kStart, "", kPaused, ""},
    {kRunning, Verb::kSuspend, Answer::kStart, "", kSuspended, ""},
    {kRunning, Verb::kWake, Answer::kRefuse, "", "", "invalid_state"},

    {kPaused, Verb::kDelete, Answer::kStart, kDeleting, kDeleted, ""},
    {kPaused, Verb::kPause, Answer::kRefuse, "", "", "invalid_state"},
    {kPaused, Verb::kSuspend, Answer::kRefuse, "", "", "invalid_state"},
    {kPaused, Verb::kWake, Answer::kStart, "", kRunning, ""},

    {kSuspended, Verb::kDelete, Answer::kStart, kDeleting, kDeleted, ""},
    {kSuspended, Verb::kPause, Answer::kRefuse, "", "", "invalid_state"},
    {kSuspended, Verb::kSuspend, Answer::kRefuse, "", "", "invalid_state"},
    {kSuspended, Verb::kWake, Answer::kStart, "", kRunning, ""},

    {kFailed, Verb::kDelete, Answer::kStart, kDeleting, kDeleted, ""},
    {kFailed, Verb::kPause, Answer::kRefuse, "", "", "invalid_state"},
    {kFailed, Verb::kSuspend, Answer::kRefuse, "", "", "invalid_state"},
    {kFailed, Verb::kWake, Answer::kRefuse, "", "", "invalid_state"},

    // A delete whose operation is no longer in flight (the store says so) starts again.
    {kDeleting, Verb::kDelete, Answer::kStart, kDeleting, kDeleted, ""},
    {kDeleting, Verb::kPause, Answer::kRefuse, "", "", "invalid_state"},
    {kDeleting, Verb::kSuspend, Answer::kRefuse, "", "", "invalid_state"},
    {kDeleting, Verb::kWake, Answer::kRefuse, "", "", "invalid_state"},

    // Deleting is idempotent: the delete that removed it answers.
    {kDeleted, Verb::kDelete, Answer::kDone, "", "", ""},
    {kDeleted, Verb::kPause, Answer::kRefuse, "", "", "invalid_state"},
    {kDeleted, Verb::kSuspend, Answer::kRefuse, "", "", "invalid_state"},
    {kDeleted, Verb::kWake, Answer::kRefuse, "", "", "invalid_state"},

    // Its node is gone (docs/scale.md): it can only be deleted.
    {kLost, Verb::kDelete, Answer::kStart, kDeleting, kDeleted, ""},
    {kLost, Verb::kPause, Answer::kRefuse, "", "", "invalid_state"},
    {kLost, Verb::kSuspend, Answer::kRefuse, "", "", "invalid_state"},
    {kLost, Verb::kWake, Answer::kRefuse, "", "", "invalid_state"},
};

TEST(SandboxState, EveryStateAndVerb) {
  ASSERT_EQ(std::size(kExpected), kStates.size() * kVerbs.size());
  for (const Row& row : kExpected) {
    SCOPED_TRACE(std::string(row.state) + " x " + std::string(RulesOf(row.verb).name));
    const Transition t = TransitionOf(row.state, row.verb);
    EXPECT_EQ(t.answer, row.answer);
    EXPECT_EQ(t.during, row.during);
    EXPECT_EQ(t.after, row.after);
    EXPECT_EQ(t.error, row.error);
  }
}

TEST(SandboxState, UnknownStateRefuses) {
  for (const VerbRules& v : kVerbs) {
    const Transition t = TransitionOf("exploded", v.verb);
    EXPECT_EQ(t.answer, Answer::kRefuse);
    EXPECT_EQ(t.error, "invalid_state");
  }
  EXPECT_FALSE(IsSandboxState("exploded"));
  EXPECT_FALSE(IsSandboxState(""));
}

TEST(SandboxState, Verbs) {
  for (size_t i = 0; i < kVerbs.size(); ++i) {
    EXPECT_EQ(static_cast<size_t>(kVerbs[i].verb), i) << "kVerbs is indexed by Verb";
    EXPECT_EQ(VerbNamed(kVerbs[i].name), kVerbs[i].verb);
  }
  EXPECT_EQ(VerbNamed("create"), std::nullopt);
  // Only delete overtakes an operation in flight; only delete works without pause support.
  EXPECT_TRUE(RulesOf(Verb::kDelete).overtakes);
  EXPECT_FALSE(RulesOf(Verb::kDelete).needs_pause);
  for (Verb v : {Verb::kPause, Verb::kSuspend, Verb::kWake}) {
    EXPECT_FALSE(RulesOf(v).overtakes);
    EXPECT_TRUE(RulesOf(v).needs_pause);
  }
  EXPECT_EQ(RulesOf(Verb::kPause).refused_because,
            "only a running sandbox can be paused or suspended");
  EXPECT_EQ(RulesOf(Verb::kSuspend).refused_because,
            "only a running sandbox can be paused or suspended");
  EXPECT_EQ(RulesOf(Verb::kWake).refused_because, "only a paused or suspended sandbox wakes");
}

TEST(SandboxState, OnRestart) {
  EXPECT_EQ(OnRestartOf(kCreating), OnRestart::kFail);
  EXPECT_EQ(OnRestartOf(kRunning), OnRestart::kAdopt);
  EXPECT_EQ(OnRestartOf(kPaused), OnRestart::kAdopt);
  EXPECT_EQ(OnRestartOf(kSuspended), OnRestart::kAdopt);
  EXPECT_EQ(OnRestartOf(kFailed), OnRestart::kKeep);
  EXPECT_EQ(OnRestartOf(kDeleting), OnRestart::kRedriveDelete);
  EXPECT_EQ(OnRestartOf(kDeleted), OnRestart::kKeep);
  EXPECT_EQ(OnRestartOf(kLost), OnRestart::kRelease);
}

TEST(SandboxState, LiveAndFrozen) {
  for (std::string_view s : kStates) {
    const bool live = std::find(std::begin(kLiveStates), std::end(kLiveStates), s) !=
                      std::end(kLiveStates);
    EXPECT_EQ(live, s != kDeleted) << s;
    EXPECT_EQ(IsFrozenState(s), s == kPaused || s == kSuspended) << s;
  }
}

}  // namespace
}  // namespace sbx::service
