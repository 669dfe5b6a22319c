#include "api/requests.h"

#include <gtest/gtest.h>

#include <csignal>
#include <string>
#include <vector>

#include "common/json_util.h"
#include "common/status_util.h"

namespace sbx::api {
namespace {

ResourceLimits kLimits;

std::string FieldOf(const absl::Status& s) { return ApiErrorField(s); }

TEST(ParseCreateSandbox, DefaultsFromEmptyBody) {
  auto r = ParseCreateSandbox("", kLimits);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->template_ref, "base");
  EXPECT_FALSE(r->vcpu.has_value());
  EXPECT_EQ(r->egress_profile, "none");
}

TEST(ParseCreateSandbox, FullBody) {
  auto r = ParseCreateSandbox(
      R"({"template":"base:latest","resources":{"vcpu":2,"memory_mib":256,"disk_mib":null},
          "env":{"A":"1"},"labels":{"team":"x"},"runtime":"ns"})",
      kLimits);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r->vcpu, 2);
  EXPECT_EQ(*r->memory_mib, 256);
  EXPECT_FALSE(r->disk_mib.has_value());
  EXPECT_EQ(r->env.at("A"), "1");
  EXPECT_EQ(r->labels.at("team"), "x");
  EXPECT_EQ(*r->runtime, "ns");
}

TEST(ParseCreateSandbox, RejectsWithFieldNames) {
  struct Case {
    const char* body;
    const char* field;
  } cases[] = {
      {R"({"nope":1})", "nope"},
      {R"({"template":5})", "template"},
      {R"({"template":""})", "template"},
      {R"({"resources":{"vcpu":0}})", "resources.vcpu"},
      {R"({"resources":{"vcpu":"2"}})", "resources.vcpu"},
      {R"({"resources":{"vcpu":1.5}})", "resources.vcpu"},
      {R"({"resources":{"memory_mib":1000000000}})", "resources.memory_mib"},
      {R"({"resources":{"memory_mib":-5}})", "resources.memory_mib"},
      {R"({"resources":{"memory_mib":18446744073709551615}})", "resources.memory_mib"},
      {R"({"resources":{"gpus":1}})", "resources.gpus"},
      {R"({"resources":[]})", "resources"},
      // Integers only: a number with a fraction or an exponent is refused even when whole.
      {R"({"resources":{"memory_mib":2.0}})", "resources.memory_mib"},
      {R"({"resources":{"disk_mib":1e3}})", "resources.disk_mib"},
      {R"({"resources":{"memory_mib":1e300}})", "resources.memory_mib"},
      {R"({"resources":{"memory_mib":9223372036854775808}})", "resources.memory_mib"},
      {R"({"resources":{"disk_mib":true}})", "resources.disk_mib"},
      {R"({"resources":{"disk_mib":0}})", "resources.disk_mib"},
      {R"({"resources":{"memory_mib":0}})", "resources.memory_mib"},
      {R"({"resources":{"vcpu":{"n":1}}})", "resources.vcpu"},
      {R"({"resources":{"vcpu":[1]}})", "resources.vcpu"},
      // Deployment defaults, not requestable (DESIGN.md §3).
      {R"({"resources":{"pids":100}})", "resources.pids"},
      {R"({"resources":{"open_files":100}})", "resources.open_files"},
      {R"({"resources":{"tmp_mib":100}})", "resources.tmp_mib"},
      {R"({"env":{"1BAD":"x"}})", "env.1BAD"},
      {R"({"env":{"OK":1}})", "env.OK"},
      {R"({"labels":{"k":["v"]}})", "labels.k"},
      {R"({"egress_profile":7})", "egress_profile"},
      {R"({"egress":[1]})", "egress"},
      {R"({"timeout_s":-1})", "timeout_s"},
      {R"({"placement":[]})", "placement"},
      {R"({"placement":{"node":"a"}})", "placement.node"},
      {R"({"placement":{"anti_affinity":7}})", "placement.anti_affinity"},
      {R"({"placement":{"anti_affinity":"job"}})", "placement.anti_affinity"},
      {R"({"labels":{"job":"x"},"placement":{"anti_affinity":"team"}})", "placement.anti_affinity"},
  };
  for (const auto& c : cases) {
    auto r = ParseCreateSandbox(c.body, kLimits);
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.body;
    EXPECT_EQ(FieldOf(r.status()), c.field) << c.body << ": " << r.status();
  }
}

TEST(ParseCreateSandbox, AntiAffinityNamesOneOfTheLabels) {
  auto r = ParseCreateSandbox(R"({"labels":{"job":"x"},"placement":{"anti_affinity":"job"}})",
                              kLimits);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->anti_affinity, "job");
  for (const char* body : {R"({"placement":null})", R"({"placement":{}})",
                           R"({"placement":{"anti_affinity":null}})"}) {
    r = ParseCreateSandbox(body, kLimits);
    ASSERT_TRUE(r.ok()) << body << ": " << r.status();
    EXPECT_FALSE(r->anti_affinity.has_value()) << body;
  }
}

TEST(ParseCreateSandbox, RejectsNonObjects) {
  for (const char* body : {"[]", "null", "\"x\"", "{", "{\"a\":}", "\xff\xfe"}) {
    auto r = ParseCreateSandbox(body, kLimits);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << body;
  }
}

TEST(ParseCreateSession, ArgvRules) {
  auto ok = ParseCreateSession(R"json({"argv":["python3","-c","print(1)"],"cwd":"/tmp"})json");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->argv.size(), 3u);
  EXPECT_EQ(*ok->cwd, "/tmp");
  struct Case {
    const char* body;
    const char* field;
  } cases[] = {
      {R"({})", "argv"},
      {R"({"argv":[]})", "argv"},
      {R"({"argv":"ls"})", "argv"},
      {R"({"argv":["ls",1]})", "argv[1]"},
      {R"({"argv":[""]})", "argv[0]"},
      {R"({"argv":["ls"],"cwd":"rel"})", "cwd"},
      {R"({"argv":["ls"],"tty":"yes"})", "tty"},
      {R"({"argv":["ls"],"user":"a b"})", "user"},
      {R"({"argv":["ls"],"extra":true})", "extra"},
  };
  for (const auto& c : cases) {
    auto r = ParseCreateSession(c.body);
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_EQ(FieldOf(r.status()), c.field) << c.body << ": " << r.status();
  }
  EXPECT_FALSE(ParseCreateSession("").ok());
}

TEST(QueryParsers, LimitLabelKeyLastEventId) {
  EXPECT_EQ(*ParseLimit(std::nullopt), 50);
  EXPECT_EQ(*ParseLimit("500"), 500);
  EXPECT_FALSE(ParseLimit("0").ok());
  EXPECT_FALSE(ParseLimit("501").ok());
  EXPECT_FALSE(ParseLimit("5x").ok());
  EXPECT_EQ(ParseLabelFilter("a=b=c")->second, "b=c");
  EXPECT_FALSE(ParseLabelFilter("=b").ok());
  EXPECT_FALSE(ParseLabelFilter("ab").ok());
  EXPECT_TRUE(ValidateIdempotencyKey("k-1").ok());
  EXPECT_FALSE(ValidateIdempotencyKey("").ok());
  EXPECT_FALSE(ValidateIdempotencyKey(std::string(256, 'a')).ok());
  EXPECT_FALSE(ValidateIdempotencyKey("a\nb").ok());
  EXPECT_EQ(*ParseLastEventId("42"), 42u);
  EXPECT_FALSE(ParseLastEventId("-1").ok());
  EXPECT_FALSE(ParseLastEventId("").ok());
}

TEST(ParseCreateSession, InteractiveFields) {
  auto r = ParseCreateSession(
      R"({"argv":["sh"],"tty":{"rows":30,"cols":100},"stdin":true,"timeout_s":5,)"
      R"("kill_grace_s":0})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->tty);
  EXPECT_EQ(r->tty_rows, 30);
  EXPECT_EQ(r->tty_cols, 100);
  EXPECT_TRUE(r->stdin_open);
  EXPECT_EQ(r->timeout_s, 5);
  EXPECT_EQ(r->kill_grace_s, 0);
  auto plain = ParseCreateSession(R"({"argv":["sh"],"tty":true})");
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->tty);
  EXPECT_FALSE(plain->tty_rows.has_value());
  struct Case {
    const char* body;
    const char* field;
  } cases[] = {
      {R"({"argv":["sh"],"tty":{"rows":0}})", "tty.rows"},
      {R"({"argv":["sh"],"tty":{"cols":1001}})", "tty.cols"},
      {R"({"argv":["sh"],"tty":{"width":3}})", "tty.width"},
      {R"({"argv":["sh"],"kill_grace_s":3})", "kill_grace_s"},
      {R"({"argv":["sh"],"timeout_s":5,"kill_grace_s":301})", "kill_grace_s"},
      {R"({"argv":["sh"],"timeout_s":0})", "timeout_s"},
  };
  for (const auto& c : cases) {
    auto bad = ParseCreateSession(c.body);
    ASSERT_FALSE(bad.ok()) << c.body;
    EXPECT_EQ(FieldOf(bad.status()), c.field) << c.body;
  }
}

TEST(ParseStdinBody, RawAndJsonForms) {
  EXPECT_EQ(*ParseStdinBody(std::string("a\0b", 3), false), std::string("a\0b", 3));
  EXPECT_EQ(*ParseStdinBody(R"({"data":"héllo"})", true), "héllo");
  EXPECT_EQ(*ParseStdinBody(R"({"data_b64":"AAE="})", true), std::string("\0\1", 2));
  EXPECT_EQ(*ParseStdinBody("", false), "");
  for (const char* bad : {R"({"data":"x","data_b64":"eA=="})", R"({})", R"({"data_b64":"@"})",
                          R"({"data":1})", R"({"more":"x"})", "[1]", "not json"}) {
    EXPECT_EQ(ParseStdinBody(bad, true).status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
  auto big = ParseStdinBody(std::string(kMaxStdinBytes + 1, 'x'), false);
  EXPECT_EQ(ApiErrorCode(big.status()), "payload_too_large");
  EXPECT_TRUE(ParseStdinBody(std::string(kMaxStdinBytes, 'x'), false).ok());
}

// null is a field left out (the contract's convention), in each optional field of these bodies.
TEST(NullIsLeftOut, StdinTenantTokenAndTty) {
  EXPECT_EQ(*ParseStdinBody(R"({"data":null,"data_b64":"eA=="})", true), "x");
  EXPECT_EQ(*ParseStdinBody(R"({"data":"y","data_b64":null})", true), "y");
  EXPECT_EQ(FieldOf(ParseStdinBody(R"({"data":null,"data_b64":null})", true).status()), "data");

  auto t = ParseTenantSpec(
      R"({"name":"a","quotas":{"max_sandboxes":null,"max_vcpu":2},"rate_limit":{"requests_per_s":1,"burst":null}})",
      true);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t->quotas, nlohmann::json({{"max_vcpu", 2}}));
  EXPECT_EQ(*t->rate_limit, nlohmann::json({{"requests_per_s", 1.0}}));
  auto patch = ParseTenantSpec(R"({"name":null,"quotas":null,"rate_limit":null})", false);
  ASSERT_TRUE(patch.ok()) << patch.status();  // a PATCH that changes nothing
  EXPECT_FALSE(patch->name.has_value());
  EXPECT_FALSE(patch->quotas.has_value());
  EXPECT_FALSE(patch->rate_limit.has_value());
  EXPECT_EQ(FieldOf(ParseTenantSpec(R"({"name":null})", true).status()), "name");  // required
  auto no_rate = ParseTenantSpec(R"({"rate_limit":{"requests_per_s":null,"burst":null}})", false);
  ASSERT_TRUE(no_rate.ok()) << no_rate.status();
  EXPECT_EQ(*no_rate->rate_limit, nlohmann::json::object());  // as {}: back to the default

  auto tok = ParseTokenSpec(R"({"name":"ci","scopes":["read"],"expires_in_s":null})");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_FALSE(tok->expires_in_s.has_value());

  auto s = ParseCreateSession(R"({"argv":["sh"],"tty":{"rows":null,"cols":null},"cwd":null,"env":null,"user":null,"stdin":null,"timeout_s":null,"kill_grace_s":null})");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->tty);
  EXPECT_FALSE(s->tty_rows.has_value());
  EXPECT_FALSE(s->tty_cols.has_value());
  auto c = ParseCreateSandbox(R"({"template":null,"resources":null,"env":null,"labels":null,"timeout_s":null})", kLimits);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->template_ref, "base");
}

TEST(ParseSignalBody, NamesAndNumbers) {
  EXPECT_EQ(*ParseSignalBody(R"({"signal":"TERM"})"), 15);
  EXPECT_EQ(*ParseSignalBody(R"({"signal":"sigint"})"), 2);
  EXPECT_EQ(*ParseSignalBody(R"({"signal":"KILL"})"), 9);
  EXPECT_EQ(*ParseSignalBody(R"({"signal":1})"), 1);
  for (const char* bad : {R"({"signal":"NOPE"})", R"({"signal":0})", R"({"signal":65})",
                          R"({"signal":null})", R"({})", R"({"signal":"TERM","x":1})",
                          R"({"signal":1.5})"}) {
    auto r = ParseSignalBody(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(FieldOf(ParseSignalBody(R"({"signal":"NOPE"})").status()), "signal");
}

TEST(ParseResizeBody, Bounds) {
  EXPECT_EQ(*ParseResizeBody(R"({"rows":24,"cols":80})"), std::make_pair(24, 80));
  EXPECT_EQ(FieldOf(ParseResizeBody(R"({"rows":0,"cols":80})").status()), "rows");
  EXPECT_EQ(FieldOf(ParseResizeBody(R"({"rows":24})").status()), "cols");
  EXPECT_EQ(FieldOf(ParseResizeBody(R"({"rows":24,"cols":1001})").status()), "cols");
}

TEST(EgressPatch, TakesAllowOnly) {
  auto ok = ParseEgressPatch(R"({"allow":[{"cidr":"198.18.0.2/32"}]})");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)["allow"].size(), 1u);
  EXPECT_TRUE(ParseEgressPatch(R"({"allow":[]})").ok());
  EXPECT_EQ(FieldOf(ParseEgressPatch("{}").status()), "allow");
  EXPECT_EQ(FieldOf(ParseEgressPatch(R"({"allow":[],"deny":[]})").status()), "deny");
  EXPECT_FALSE(ParseEgressPatch("").ok());
  EXPECT_FALSE(ParseEgressPatch("[1]").ok());
  EXPECT_FALSE(ParseEgressPatch("{nope").ok());
}

TEST(TenantSpec, NameQuotasAndRate) {
  auto ok = ParseTenantSpec(
      R"({"name":"team a","quotas":{"max_sandboxes":3,"max_vcpu":0},"rate_limit":{"requests_per_s":0.5,"burst":2}})",
      /*create=*/true);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok->name, "team a");
  EXPECT_EQ((*ok->quotas)["max_sandboxes"], 3);
  EXPECT_EQ((*ok->rate_limit)["burst"], 2);
  EXPECT_EQ(FieldOf(ParseTenantSpec("{}", true).status()), "name");
  EXPECT_TRUE(ParseTenantSpec("", false).ok());  // a PATCH that changes nothing
  EXPECT_EQ(FieldOf(ParseTenantSpec(R"({"name":""})", true).status()), "name");
  EXPECT_EQ(FieldOf(ParseTenantSpec(R"({"name":"a/b"})", true).status()), "name");
  EXPECT_EQ(FieldOf(ParseTenantSpec(R"({"name":"a","x":1})", true).status()), "x");
  EXPECT_EQ(FieldOf(ParseTenantSpec(R"({"quotas":{"max_gpus":1}})", false).status()),
            "quotas.max_gpus");
  EXPECT_EQ(FieldOf(ParseTenantSpec(R"({"quotas":{"max_vcpu":-1}})", false).status()),
            "quotas.max_vcpu");
  EXPECT_EQ(FieldOf(ParseTenantSpec(R"({"quotas":{"max_vcpu":1.5}})", false).status()),
            "quotas.max_vcpu");
  EXPECT_EQ(FieldOf(ParseTenantSpec(R"({"quotas":[]})", false).status()), "quotas");
  EXPECT_EQ(FieldOf(ParseTenantSpec(R"({"rate_limit":{"requests_per_s":0}})", false).status()),
            "rate_limit.requests_per_s");
  EXPECT_EQ(FieldOf(ParseTenantSpec(R"({"rate_limit":{"burst":3}})", false).status()),
            "rate_limit.burst");
  EXPECT_TRUE(ParseTenantSpec(R"({"rate_limit":{}})", false).ok());  // back to the default
}

TEST(TenantSpec, EgressProfiles) {
  auto ok = ParseTenantSpec(R"({"egress_profiles":["lab","pypi","lab"]})", false);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok->egress_profiles, nlohmann::json::array({"lab", "pypi"}));  // once each
  ok = ParseTenantSpec(R"({"egress_profiles":null})", false);  // every profile again
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_TRUE(ok->egress_profiles.has_value());
  EXPECT_TRUE(ok->egress_profiles->is_null());
  ok = ParseTenantSpec(R"({"egress_profiles":[]})", false);  // `none` only
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->egress_profiles->is_array() && ok->egress_profiles->empty());
  EXPECT_FALSE(ParseTenantSpec(R"({"name":"a"})", true)->egress_profiles.has_value());
  EXPECT_EQ(FieldOf(ParseTenantSpec(R"({"egress_profiles":"lab"})", false).status()),
            "egress_profiles");
  EXPECT_EQ(FieldOf(ParseTenantSpec(R"({"egress_profiles":{}})", false).status()),
            "egress_profiles");
  for (const char* bad : {R"([1])", R"([""])", R"(["Lab"])", R"(["a-b"])", R"(["a b"])",
                          R"([null])", R"(["ok","p;drop"])"}) {
    auto r = ParseTenantSpec(std::string(R"({"egress_profiles":)") + bad + "}", false);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_EQ(FieldOf(r.status()).rfind("egress_profiles[", 0), 0u) << bad;
    }
  }
  EXPECT_FALSE(ParseTenantSpec(R"({"egress_profiles":[")" + std::string(64, 'a') + R"("]})",
                               false).ok());
  std::string many = R"({"egress_profiles":[)";
  for (int i = 0; i < 257; ++i) many += (i ? "," : "") + ("\"p" + std::to_string(i) + "\"");
  EXPECT_EQ(FieldOf(ParseTenantSpec(many + "]}", false).status()), "egress_profiles");
}

TEST(TokenSpec, NameScopesExpiry) {
  auto ok = ParseTokenSpec(R"({"name":"ci","scopes":["read","files"],"expires_in_s":60})");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->scopes, (std::vector<std::string>{"read", "files"}));
  EXPECT_EQ(*ok->expires_in_s, 60);
  EXPECT_EQ(FieldOf(ParseTokenSpec(R"({"scopes":["read"]})").status()), "name");
  EXPECT_EQ(FieldOf(ParseTokenSpec(R"({"name":"x"})").status()), "scopes");
  EXPECT_EQ(FieldOf(ParseTokenSpec(R"({"name":"x","scopes":[]})").status()), "scopes");
  EXPECT_EQ(FieldOf(ParseTokenSpec(R"({"name":"x","scopes":[1]})").status()), "scopes[0]");
  EXPECT_EQ(FieldOf(ParseTokenSpec(R"({"name":"x","scopes":["read"],"expires_in_s":0})").status()),
            "expires_in_s");
  EXPECT_FALSE(ParseTokenSpec("").ok());
}

std::string Deep(int levels) { return std::string(levels, '[') + std::string(levels, ']'); }

// Issue 13: every body parser refuses a body nested past the limit, up front, with a 400 that
// says why, and takes one at the limit to its ordinary field checks.
TEST(RequestDepth, EveryParserRefusesDeepBodies) {
  const std::string deep = Deep(400000);
  const std::vector<absl::Status> refused = {
      ParseCreateSandbox(deep, kLimits).status(),
      ParseCreateSandbox(R"({"labels":{"a":)" + deep + "}}", kLimits).status(),
      ParseCreateSession(R"({"argv":)" + deep + "}").status(),
      ParseLifecycleBody(R"({"x":)" + deep + "}"),
      ParseEgressPatch(R"({"allow":)" + deep + "}").status(),
      ParseStdinBody(R"({"data":)" + deep + "}", /*json_body=*/true).status(),
      ParseSignalBody(R"({"signal":)" + deep + "}").status(),
      ParseResizeBody(R"({"rows":)" + deep + R"(,"cols":1})").status(),
      ParseWsControl(R"({"type":"resize","cols":10,"rows":)" + deep + "}").status(),
  };
  for (const absl::Status& s : refused) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_EQ(ApiErrorCode(s), "invalid_argument") << s;
    EXPECT_TRUE(IsJsonTooDeep(s)) << s;
    EXPECT_NE(std::string(s.message()).find("nests deeper than 64 levels"), std::string::npos)
        << s;
  }
  // Raw stdin (not JSON) is bytes, whatever they look like.
  EXPECT_TRUE(ParseStdinBody(Deep(100000), /*json_body=*/false).ok());
}

TEST(RequestDepth, TheLimitItselfIsAccepted) {
  // 64 levels in all: the body object and 63 arrays. Refused for the content, not the depth.
  auto at = ParseCreateSession(R"({"argv":)" + Deep(63) + "}");
  ASSERT_FALSE(at.ok());
  EXPECT_FALSE(IsJsonTooDeep(at.status())) << at.status();
  EXPECT_EQ(FieldOf(at.status()), "argv[0]");
  auto past = ParseCreateSession(R"({"argv":)" + Deep(64) + "}");
  EXPECT_TRUE(IsJsonTooDeep(past.status())) << past.status();
}

TEST(ParseWsControl, TypedMessages) {
  auto r = ParseWsControl(R"({"type":"resize","rows":24,"cols":80})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->type, WsControl::Type::kResize);
  EXPECT_EQ(r->rows, 24);
  EXPECT_EQ(r->cols, 80);
  r = ParseWsControl(R"({"type":"signal","signal":"TERM"})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->type, WsControl::Type::kSignal);
  EXPECT_EQ(r->signal, SIGTERM);
  r = ParseWsControl(R"({"type":"stdin_close"})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->type, WsControl::Type::kStdinClose);
}

TEST(ParseWsControl, WrongMessagesAreRefusedButNotAsTooDeep) {
  for (const char* bad : {"not json", "[]", R"({"type":5})", R"({"type":"dance"})",
                          R"({"type":"resize","rows":0,"cols":80})",
                          R"({"type":"signal","signal":[[[1]]]})",
                          R"({"type":"resize","rows":1,"cols":1,"x":1})"}) {
    auto r = ParseWsControl(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_FALSE(IsJsonTooDeep(r.status())) << bad;
  }
  // An unknown type or signal is named, but not at any length (the message goes back to the
  // client and into the log).
  auto r = ParseWsControl(R"({"type":")" + std::string(100000, 'x') + R"("})");
  ASSERT_FALSE(r.ok());
  EXPECT_LT(r.status().message().size(), 200u);
  r = ParseWsControl(R"({"type":"signal","signal":")" + std::string(100000, 'x') + R"("})");
  ASSERT_FALSE(r.ok());
  EXPECT_LT(r.status().message().size(), 200u);
}

TEST(ParseWsControl, DeepMessagesAreTooDeep) {
  for (const std::string& text :
       {R"({"type":"resize","cols":10,"rows":)" + Deep(400000) + "}",
        R"({"type":"signal","signal":)" + Deep(400000) + "}",
        R"({"type":"stdin_close","x":)" + Deep(65) + "}"}) {
    auto r = ParseWsControl(text);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(IsJsonTooDeep(r.status())) << r.status();
  }
}

}  // namespace
}  // namespace sbx::api
