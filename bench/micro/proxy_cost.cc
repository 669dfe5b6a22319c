// sbx-proxy-cost: what sbxd's Host/SNI proxy (net/conn_proxy.h) adds to a connection, on
// loopback, without root: the same download and the same TLS handshakes straight to a server
// and through a ConnProxy whose hooks allow the name (the nftables redirect and the veth are
// not in the path: they are the same with and without the proxy).
//   download: a server sends N MiB after the request line; client reads to EOF. Alternating
//     direct / proxied rounds; MiB/s per round, and the proxied/direct ratio of the medians.
//   handshake: TLS 1.3 handshakes (P-256 certificate made in-process) direct and proxied,
//     alternating; p50 and p90 of each and the p50 difference (the SNI peek + the upstream
//     connect the proxy makes).
// Process CPU time (getrusage: the proxy thread, the server and the client are all in this
// process) is reported per MiB for each download mode.
// Usage: sbx-proxy-cost [MiB per download (default 256)] [rounds (default 5)] [handshakes (default 300)]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "net/conn_proxy.h"

namespace {

using Clock = std::chrono::steady_clock;
using sbx::net::IpPrefix;

IpPrefix Loopback() {
  const uint8_t a[4] = {127, 0, 0, 1};
  return IpPrefix::Host(AF_INET, a);
}

int Listen(uint16_t* port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(fd, 256) != 0) {
    std::perror("bind/listen");
    std::exit(1);
  }
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

int Dial(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    std::perror("connect");
    std::exit(1);
  }
  return fd;
}

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

// Sends `bytes` to each connection once its first read returns (the request).
void DownloadServer(int lfd, size_t bytes) {
  static char buf[1 << 16];
  std::memset(buf, 'x', sizeof(buf));
  while (true) {
    int c = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return;
    char req[4096];
    if (recv(c, req, sizeof(req), 0) > 0) {
      size_t left = bytes;
      while (left > 0) {
        ssize_t n = send(c, buf, std::min(left, sizeof(buf)), MSG_NOSIGNAL);
        if (n <= 0) break;
        left -= static_cast<size_t>(n);
      }
    }
    close(c);
  }
}

size_t Download(uint16_t port) {
  int fd = Dial(port);
  const char req[] = "GET /big HTTP/1.1\r\nHost: bench.test\r\n\r\n";
  send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL);
  static char buf[1 << 18];
  size_t got = 0;
  while (true) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(fd);
  return got;
}

// A self-signed P-256 certificate for bench.test.
SSL_CTX* ServerContext() {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* cert = X509_new();
  ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert), 0);
  X509_gmtime_adj(X509_getm_notAfter(cert), 3600);
  X509_set_pubkey(cert, key);
  X509_NAME* name = X509_get_subject_name(cert);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("bench.test"), -1, -1, 0);
  X509_set_issuer_name(cert, name);
  X509_sign(cert, key, EVP_sha256());
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  SSL_CTX_use_certificate(ctx, cert);
  SSL_CTX_use_PrivateKey(ctx, key);
  return ctx;
}

void TlsServer(int lfd, SSL_CTX* ctx) {
  while (true) {
    int c = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return;
    int one = 1;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    SSL* ssl = SSL_new(ctx);
    SSL_set_fd(ssl, c);
    if (SSL_accept(ssl) == 1) {
      char b[16];
      SSL_read(ssl, b, sizeof(b));
      SSL_write(ssl, "k", 1);
    }
    SSL_free(ssl);
    close(c);
  }
}

// One TLS handshake and a 1-byte exchange (the server's Finished is answered before this
// returns); the certificate is not verified (the cost measured is the path, not PKI).
double Handshake(SSL_CTX* ctx, uint16_t port) {
  auto t0 = Clock::now();
  int fd = Dial(port);
  SSL* ssl = SSL_new(ctx);
  SSL_set_fd(ssl, fd);
  SSL_set_tlsext_host_name(ssl, "bench.test");
  if (SSL_connect(ssl) != 1) {
    std::fprintf(stderr, "handshake failed\n");
    std::exit(1);
  }
  SSL_write(ssl, "p", 1);
  char b[4];
  SSL_read(ssl, b, sizeof(b));
  double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  SSL_free(ssl);
  close(fd);
  return ms;
}

std::unique_ptr<sbx::net::ConnProxy> StartProxy(uint16_t dest_port) {
  sbx::net::ProxyHooks h;
  auto rule = sbx::net::ParseRule(nlohmann::json{{"domain", "bench.test"}}, "bench");
  sbx::net::EffectiveRules rules;
  rules.allow = {*rule};
  h.id_of_address = [](const IpPrefix&) -> std::optional<std::string> { return "bench"; };
  h.rules_of = [rules](const std::string&) -> std::optional<sbx::net::EffectiveRules> { return rules; };
  h.resolved = [](const std::string&, const std::string&, const IpPrefix&) { return true; };
  h.forbidden = [](const IpPrefix&) -> std::optional<std::string> { return std::nullopt; };
  h.deny = [](const std::string&, const std::string& reason, const IpPrefix&, const std::string&,
              uint16_t) { std::fprintf(stderr, "denied: %s\n", reason.c_str()); };
  h.original_dst = [dest_port](int) -> absl::StatusOr<std::pair<IpPrefix, uint16_t>> {
    return std::make_pair(Loopback(), dest_port);
  };
  sbx::net::ProxyOptions o;
  o.loopback_only = true;
  auto p = sbx::net::ConnProxy::Start(o, std::move(h));
  if (!p.ok()) {
    std::fprintf(stderr, "proxy: %s\n", std::string(p.status().message()).c_str());
    std::exit(1);
  }
  return std::move(*p);
}

}  // namespace

int main(int argc, char** argv) {
  size_t mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 256;
  int rounds = argc > 2 ? std::atoi(argv[2]) : 5;
  int handshakes = argc > 3 ? std::atoi(argv[3]) : 300;

  uint16_t dport = 0;
  int dl = Listen(&dport);
  std::thread(DownloadServer, dl, mib << 20).detach();
  auto dproxy = StartProxy(dport);

  std::vector<double> direct, proxied;
  double cpu_direct = 0, cpu_proxied = 0;
  for (int r = 0; r < rounds; ++r) {
    for (int mode = 0; mode < 2; ++mode) {
      double c0 = CpuSeconds();
      auto t0 = Clock::now();
      size_t got = Download(mode == 0 ? dport : dproxy->port());
      double s = std::chrono::duration<double>(Clock::now() - t0).count();
      double cpu = CpuSeconds() - c0;
      if (got != (mib << 20)) {
        std::fprintf(stderr, "short download: %zu bytes\n", got);
        return 1;
      }
      (mode == 0 ? direct : proxied).push_back(static_cast<double>(mib) / s);
      (mode == 0 ? cpu_direct : cpu_proxied) += cpu;
    }
  }
  std::printf("download %zu MiB x %d rounds (alternating)\n", mib, rounds);
  std::printf("  direct : median %.0f MiB/s, CPU %.2f ms/MiB (server+client)\n", Median(direct),
              cpu_direct * 1000 / (mib * rounds));
  std::printf("  proxied: median %.0f MiB/s, CPU %.2f ms/MiB (server+proxy+client)\n",
              Median(proxied), cpu_proxied * 1000 / (mib * rounds));
  std::printf("  ratio proxied/direct: %.2f\n", Median(proxied) / Median(direct));

  uint16_t tport = 0;
  int tl = Listen(&tport);
  SSL_CTX* sctx = ServerContext();
  std::thread(TlsServer, tl, sctx).detach();
  auto tproxy = StartProxy(tport);
  SSL_CTX* cctx = SSL_CTX_new(TLS_client_method());
  std::vector<double> hd, hp;
  for (int i = 0; i < 10; ++i) Handshake(cctx, tport);  // warm-up
  for (int i = 0; i < handshakes; ++i) {
    hd.push_back(Handshake(cctx, tport));
    hp.push_back(Handshake(cctx, tproxy->port()));
  }
  std::printf("TLS handshake + 1-byte exchange, %d each (alternating)\n", handshakes);
  std::printf("  direct : p50 %.3f ms, p90 %.3f ms\n", Percentile(hd, 0.5), Percentile(hd, 0.9));
  std::printf("  proxied: p50 %.3f ms, p90 %.3f ms\n", Percentile(hp, 0.5), Percentile(hp, 0.9));
  std::printf("  p50 overhead of the SNI check and relay: %.3f ms\n",
              Percentile(hp, 0.5) - Percentile(hd, 0.5));
  return 0;
}
