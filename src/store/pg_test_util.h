// A database of its own for each PostgreSQL test, on the server tools/pg_test_server.sh started
// for the ctest run (SBX_TEST_PG_HOST names its socket directory; the ctest fixture
// pg_test_server_start sets it up). Dropped again when the object goes.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <pqxx/pqxx>

namespace sbx::store::testing {

class PgTestDatabase {
 public:
  // nullptr when no server is configured (the caller skips, or fails under
  // SBX_TESTS_MUST_RUN); throws what libpqxx throws when the server is there but refuses.
  static std::unique_ptr<PgTestDatabase> Create() {
    const char* host = std::getenv("SBX_TEST_PG_HOST");
    if (host == nullptr || *host == '\0') return nullptr;
    static std::atomic<int> counter{0};
    std::string name = fmt::format("sbxtest_{}_{}", getpid(), counter++);
    auto db = std::unique_ptr<PgTestDatabase>(new PgTestDatabase(host, name));
    pqxx::connection admin(db->Url("postgres"));
    pqxx::nontransaction(admin).exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)");
    pqxx::nontransaction(admin).exec("CREATE DATABASE " + name);
    return db;
  }

  ~PgTestDatabase() {
    try {
      pqxx::connection admin(Url("postgres"));
      pqxx::nontransaction(admin).exec("DROP DATABASE IF EXISTS " + name_ + " WITH (FORCE)");
    } catch (const std::exception&) {
      // The server went first (its stop fixture removes everything anyway).
    }
  }

  const std::string& url() const { return url_; }
  std::string Url(const std::string& db) const {
    return fmt::format("postgresql:///{}?host={}&user=sbx", db, host_);
  }

 private:
  PgTestDatabase(std::string host, std::string name)
      : host_(std::move(host)), name_(std::move(name)), url_(Url(name_)) {}

  std::string host_;
  std::string name_;
  std::string url_;
};

}  // namespace sbx::store::testing
