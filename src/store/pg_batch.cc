#include "store/pg_batch.h"

#include <poll.h>

#include <exception>
#include <utility>

#include <fmt/format.h>

#include "common/status_util.h"

namespace sbx::store {

std::string ToPgPlaceholders(std::string_view sql) {
  std::string out(sql);
  for (size_t i = 0; i + 1 < out.size(); ++i) {
    if (out[i] == '?' && out[i + 1] >= '0' && out[i + 1] <= '9') out[i] = '$';
  }
  return out;
}

PgConn::PgConn(const std::string& conninfo) : conn(conninfo) {
  // libpqxx 6 would reconnect a broken connection silently between two statements: the second
  // half of a transaction would then run outside it (PgBatch sends BEGIN and COMMIT itself),
  // and the statements prepared here would be gone. A broken connection must fail.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  conn.inhibit_reactivation(true);
#pragma GCC diagnostic pop
}

bool PgConn::IdleAndOpen() {
  if (!conn.is_open()) return false;
  pollfd p{conn.sock(), POLLIN, 0};
  if (p.fd < 0) return false;
  return ::poll(&p, 1, 0) == 0;
}

absl::Status PgError(const pqxx::pqxx_exception& e, std::string_view step) {
  std::string msg = e.base().what();
  if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
  absl::StatusCode code = absl::StatusCode::kInternal;
  if (dynamic_cast<const pqxx::unique_violation*>(&e) != nullptr) {
    code = absl::StatusCode::kAlreadyExists;
  } else if (dynamic_cast<const pqxx::integrity_constraint_violation*>(&e) != nullptr) {
    code = absl::StatusCode::kFailedPrecondition;
  } else if (dynamic_cast<const pqxx::data_exception*>(&e) != nullptr ||
             dynamic_cast<const pqxx::conversion_error*>(&e) != nullptr) {
    code = absl::StatusCode::kInvalidArgument;  // e.g. text that is not UTF-8
  } else if (dynamic_cast<const pqxx::insufficient_resources*>(&e) != nullptr) {
    code = absl::StatusCode::kResourceExhausted;
  } else if (dynamic_cast<const pqxx::broken_connection*>(&e) != nullptr ||
             dynamic_cast<const pqxx::in_doubt_error*>(&e) != nullptr) {
    code = absl::StatusCode::kUnavailable;
  } else if (dynamic_cast<const pqxx::transaction_rollback*>(&e) != nullptr) {
    code = absl::StatusCode::kAborted;
  }
  return absl::Status(code, fmt::format("store: {}: {}", step, msg));
}

bool IsRetryable(const pqxx::pqxx_exception& e) {
  return dynamic_cast<const pqxx::serialization_failure*>(&e) != nullptr ||
         dynamic_cast<const pqxx::deadlock_detected*>(&e) != nullptr;
}

absl::StatusOr<pqxx::result> PgBatch::Exec(const char* sql, std::string_view step,
                                           const PgParams& p) {
  if (!failure_.ok()) return failure_;
  SBX_ASSIGN_OR_RETURN(std::string stmt, Statement(sql, step, p));
  return Send(stmt, step);
}

absl::Status PgBatch::Queue(const char* sql, std::string_view step, const PgParams& p) {
  if (!failure_.ok()) return failure_;
  if (autocommit_) {
    failure_ = absl::FailedPreconditionError(
        fmt::format("store: {}: a write inside Store::Read (a bug in sbxd)", step));
    return failure_;
  }
  SBX_ASSIGN_OR_RETURN(std::string stmt, Statement(sql, step, p));
  begun_ = true;
  pending_ += stmt;
  pending_ += ";\n";
  pending_steps_.emplace_back(step);
  return absl::OkStatus();
}

absl::Status PgBatch::Commit() {
  ended_ = true;
  if (!begun_ || autocommit_) return absl::OkStatus();
  metrics::ScopedTimer timer(commit_timer_);
  return Send("COMMIT", "commit").status();
}

void PgBatch::Rollback() noexcept {
  ended_ = true;
  pending_.clear();
  pending_steps_.clear();
  if (!begun_sent_ || autocommit_) return;
  try {
    tx_.exec("ROLLBACK");
  } catch (...) {
    conn_.poisoned = true;
  }
}

absl::StatusOr<std::string> PgBatch::Statement(const char* sql, std::string_view step,
                                               const PgParams& p) {
  std::string out;
  std::string name;
  if (auto it = conn_.prepared.find(sql); it != conn_.prepared.end()) {
    name = it->second;
  } else if (auto jt = preparing_.find(sql); jt != preparing_.end()) {
    name = jt->second;
  } else {
    name = fmt::format("sbx{}", conn_.prepared.size() + preparing_.size());
    out = fmt::format("PREPARE {} AS {};\n", name, ToPgPlaceholders(sql));
    preparing_.emplace(sql, name);
  }
  out += "EXECUTE ";
  out += name;
  if (p.values().empty()) return out;
  out += '(';
  bool first = true;
  for (const std::optional<std::string>& v : p.values()) {
    if (!first) out += ", ";
    first = false;
    if (!v) {
      out += "NULL";
      continue;
    }
    // libpq's escaping stops at a NUL, which TEXT cannot hold anyway: refuse, never cut.
    if (v->find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(
          fmt::format("store: {}: a text value holds a NUL byte", step));
    }
    try {
      out += tx_.quote(*v);
    } catch (const pqxx::broken_connection& e) {  // the escaping asks the connection
      failure_ = PgError(e, step);
      return failure_;
    } catch (const std::exception& e) {  // libpq refuses bytes invalid in the encoding
      return absl::InvalidArgumentError(fmt::format("store: {}: {}", step, e.what()));
    }
  }
  out += ')';
  return out;
}

namespace {

// "get sandbox (after put operation, put session)"; "commit (put sandbox, put session)".
std::string StepsOf(std::string_view step, const std::vector<std::string_view>& queued) {
  if (queued.empty()) return std::string(step);
  std::string out = fmt::format("{} ({}", step, step == "commit" ? "" : "after ");
  for (size_t i = 0; i < queued.size(); ++i) out += fmt::format("{}{}", i ? ", " : "", queued[i]);
  return out + ")";
}

}  // namespace

absl::StatusOr<pqxx::result> PgBatch::Send(std::string_view last, std::string_view step) {
  std::string batch;
  const bool carries_begin = !autocommit_ && !begun_sent_;
  if (carries_begin) {
    batch = "BEGIN ISOLATION LEVEL SERIALIZABLE;\n";
    begun_ = true;
  }
  batch += pending_;
  batch += last;
  pending_.clear();
  std::vector<std::string_view> queued;
  queued.swap(pending_steps_);
  begun_sent_ = true;
  try {
    // "Begin" times the round trip that carried the BEGIN (its count is still the number of
    // transactions that ran a statement).
    std::optional<metrics::ScopedTimer> timer;
    if (carries_begin) timer.emplace(begin_timer_);
    pqxx::result res = tx_.exec(batch);
    for (auto& [sql, name] : preparing_) conn_.prepared.emplace(sql, std::move(name));
    preparing_.clear();
    return res;
  } catch (const pqxx::pqxx_exception& e) {
    // Whether a PREPARE of this batch ran before the failure is unknown.
    if (!preparing_.empty()) conn_.poisoned = true;
    preparing_.clear();
    retryable_ = IsRetryable(e);
    failure_ = PgError(e, StepsOf(step, queued));
    return failure_;
  }
}

}  // namespace sbx::store
