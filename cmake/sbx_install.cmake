# `cmake --install build --prefix /usr/local` (or DESTDIR=... for packaging):
#   bin/sbxd, bin/sbx, bin/sbx-agent     sbxd finds the agent beside itself (--agent-path)
#   lib/systemd/system/sbxd.service      deploy/systemd/sbxd.service, paths made the prefix's
#   etc/sbx/sbxd.toml                    deploy/sbxd.toml, when it exists, never over an edited one
#   share/doc/sbx/                       README, docs/, the unit and the example configuration
# Directories follow GNUInstallDirs: -DCMAKE_INSTALL_SYSCONFDIR=/etc puts the configuration in
# /etc/sbx for a /usr/local prefix (GNUInstallDirs does that by itself only for prefix /usr).
include(GNUInstallDirs)

set(SBX_SYSTEMD_UNIT_DIR "lib/systemd/system" CACHE STRING
    "where the systemd unit goes (relative: under the install prefix)")

install(TARGETS sbxd sbx sbx-agent RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

install(FILES README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs)
install(FILES deploy/systemd/sbxd.service DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)

# The unit names absolute paths, which depend on the prefix given to `cmake --install`
# (--prefix), known only then: rewritten by install-time code, not by configure_file. The
# example configuration is looked for at install time too, so that one added after configuring
# is installed without re-running cmake.
install(CODE "
  set(_prefix \"\${CMAKE_INSTALL_PREFIX}\")
  function(_sbx_full dir out)
    if(IS_ABSOLUTE \"\${dir}\")
      set(\${out} \"\${dir}\" PARENT_SCOPE)
    elseif(dir STREQUAL \"etc\" AND _prefix STREQUAL \"/usr\")
      set(\${out} \"/etc\" PARENT_SCOPE)  # as GNUInstallDirs does for prefix /usr
    else()
      set(\${out} \"\${_prefix}/\${dir}\" PARENT_SCOPE)
    endif()
  endfunction()
  _sbx_full(\"${CMAKE_INSTALL_BINDIR}\" _bindir)
  _sbx_full(\"${CMAKE_INSTALL_SYSCONFDIR}\" _sysconfdir)
  _sbx_full(\"${CMAKE_INSTALL_DOCDIR}\" _docdir)
  _sbx_full(\"${SBX_SYSTEMD_UNIT_DIR}\" _unitdir)

  file(READ \"${PROJECT_SOURCE_DIR}/deploy/systemd/sbxd.service\" _unit)
  string(REPLACE \"/usr/local/bin/sbxd\" \"\${_bindir}/sbxd\" _unit \"\${_unit}\")
  string(REPLACE \"/etc/sbx/sbxd.toml\" \"\${_sysconfdir}/sbx/sbxd.toml\" _unit \"\${_unit}\")
  string(REPLACE \"/usr/local/share/doc/sbx/\" \"\${_docdir}/\" _unit \"\${_unit}\")
  set(_unit_file \"\$ENV{DESTDIR}\${_unitdir}/sbxd.service\")
  message(STATUS \"Installing: \${_unit_file}\")
  file(MAKE_DIRECTORY \"\$ENV{DESTDIR}\${_unitdir}\")
  file(WRITE \"\${_unit_file}\" \"\${_unit}\")

  set(_example \"${PROJECT_SOURCE_DIR}/deploy/sbxd.toml\")
  if(EXISTS \"\${_example}\")
    file(INSTALL \"\${_example}\" DESTINATION \"\$ENV{DESTDIR}\${_docdir}/examples\")
    # An installed configuration is the operator's: a reinstall or upgrade must not reset it.
    set(_conf \"\$ENV{DESTDIR}\${_sysconfdir}/sbx/sbxd.toml\")
    if(EXISTS \"\${_conf}\")
      message(STATUS \"Kept (already there): \${_conf}\")
    else()
      file(INSTALL \"\${_example}\" DESTINATION \"\$ENV{DESTDIR}\${_sysconfdir}/sbx\"
           FILE_PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ)
    endif()
  endif()
")
