// curl_easy_init for sbx: the handle's sockets are close-on-exec. libcurl 7.88 (Debian 12)
// makes them with socket(2) alone, so a program another thread of sbxd starts while a transfer
// runs (QEMU, mke2fs, a sandbox's launch child) would inherit the connection to a registry or
// a peer node. tools/check_house.py keeps curl_easy_init out of every other file. Header-only:
// sbx_common does not link libcurl, the files that include this do.
#pragma once

#include <sys/socket.h>

#include <curl/curl.h>

namespace sbx {

inline curl_socket_t OpenCloseOnExecSocket(void*, curlsocktype, curl_sockaddr* a) {
  return ::socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
}

// nullptr when libcurl cannot make a handle (out of memory).
inline CURL* CurlEasyInit() {
  CURL* c = curl_easy_init();
  if (c != nullptr) curl_easy_setopt(c, CURLOPT_OPENSOCKETFUNCTION, &OpenCloseOnExecSocket);
  return c;
}

}  // namespace sbx
