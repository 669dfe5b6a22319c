#include "api/status_to_http.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/status_util.h"
#include "service/admission.h"

namespace sbx::api {
namespace {

using bhttp = http::bhttp::status;

TEST(StatusToHttp, AdmissionRefusalsAre503WithRetryAfterOr422AndNameTheResource) {
  const service::HostCapacity host{2, 4096, 100000};
  service::AdmissionSettings s;
  s.reserve_memory_mib = 1024;
  const service::Demand cap = service::CapacityOf(host, s);

  absl::Status busy = service::CheckFits(service::Demand{1, 2048, 1}, service::Demand{0, 2048, 0},
                                         cap, host, s, "the sandbox");
  http::Response r = ErrorResponse(busy, "req_1");
  EXPECT_EQ(r.result(), bhttp::service_unavailable);
  EXPECT_EQ(r[http::bhttp::field::retry_after], "5");
  auto body = nlohmann::json::parse(r.body());
  EXPECT_EQ(body["error"]["code"], "insufficient_capacity");
  EXPECT_EQ(body["error"]["details"]["resource"], "memory");
  EXPECT_EQ(body["error"]["details"]["field"], "resources.memory_mib");
  EXPECT_EQ(body["error"]["details"]["requested"], 2048);
  EXPECT_EQ(body["error"]["details"]["available"], 1024);
  EXPECT_EQ(body["error"]["details"]["capacity"], 3072);

  absl::Status never = service::CheckFits(service::Demand{64, 65536, 1}, service::Demand{}, cap,
                                          host, s, "the sandbox");
  r = ErrorResponse(never, "req_2");
  EXPECT_EQ(r.result(), bhttp::unprocessable_entity);
  EXPECT_TRUE(r[http::bhttp::field::retry_after].empty());
  body = nlohmann::json::parse(r.body());
  EXPECT_EQ(body["error"]["code"], "exceeds_capacity");
  EXPECT_EQ(body["error"]["details"]["resource"], "memory");
  EXPECT_NE(body["error"]["message"].get<std::string>().find("vcpu:"), std::string::npos);
}

TEST(StatusToHttp, OtherResourceExhaustedErrorsKeepTheirStatus) {
  EXPECT_EQ(HttpStatusFor(ApiError(absl::StatusCode::kResourceExhausted, "insufficient_storage",
                                   "disk full")),
            bhttp::insufficient_storage);
  EXPECT_EQ(HttpStatusFor(absl::ResourceExhaustedError("x")), bhttp::too_many_requests);
  EXPECT_TRUE(ErrorResponse(absl::ResourceExhaustedError("x"), "r")[http::bhttp::field::retry_after]
                  .empty());
}

}  // namespace
}  // namespace sbx::api
