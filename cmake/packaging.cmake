# Install layout and the Debian package (docs/install.md).
#
#   bin/airlockd, bin/airlock                      the daemon and the CLI
#   libexec/airlock/airlock-agent, airlock-jail    helpers airlockd finds beside it (common/helpers.h)
#   /etc/airlock/airlockd.toml                     the settings (a conffile)
#   lib/systemd/system/airlockd.service            the service (/usr/lib/systemd/system)
#   share/doc/airlock/                             the README and the docs
#
# `cpack -G DEB` in a build tree (scripts/package) makes airlock_<version>_<arch>.deb with
# prefix /usr. Its runtime dependencies are named by dpkg-shlibdeps from what the programs link.

# The prefix a package has (/usr, and with it /etc for the settings), unless one is given.
if(CMAKE_INSTALL_PREFIX_INITIALIZED_TO_DEFAULT)
  set(CMAKE_INSTALL_PREFIX /usr CACHE PATH "Where cmake --install puts Airlock" FORCE)
endif()
include(GNUInstallDirs)

install(TARGETS airlockd airlock RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS airlock-agent airlock-jail RUNTIME DESTINATION ${CMAKE_INSTALL_LIBEXECDIR}/airlock)
# /etc whatever the prefix (GNUInstallDirs: /etc for /usr, <prefix>/etc otherwise).
install(FILES packaging/airlockd.toml DESTINATION ${CMAKE_INSTALL_FULL_SYSCONFDIR}/airlock)
install(FILES packaging/airlockd.service DESTINATION lib/systemd/system)
install(FILES README.md docs/airlockd.md docs/cli.md docs/quickstart.md docs/security.md
              docs/secrets.md docs/install.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(FILES docs/api/openapi.yaml DESTINATION ${CMAKE_INSTALL_DOCDIR}/api)

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME airlock)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "Airlock maintainers <airlock@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "sandboxes for code written by AI agents")
set(CPACK_PACKAGE_DESCRIPTION
    "Airlock runs code written by AI agents in disposable, isolated sandboxes: airlockd (the
daemon and its REST API), the airlock CLI, the guest agent and the jail launcher.")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# What airlockd runs besides its libraries: mount, ip (iproute2), tar; runsc for the gVisor
# engine and mmdebstrap for Debian template bases are optional.
set(CPACK_DEBIAN_PACKAGE_DEPENDS "mount, iproute2, tar, init-system-helpers")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "nftables, runsc, mmdebstrap, debian-archive-keyring")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${CMAKE_SOURCE_DIR}/packaging/debian/postinst ${CMAKE_SOURCE_DIR}/packaging/debian/prerm
    ${CMAKE_SOURCE_DIR}/packaging/debian/postrm ${CMAKE_SOURCE_DIR}/packaging/debian/conffiles)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
# Only what the install rules above name (not the tests' or benchmarks' programs).
set(CPACK_STRIP_FILES ON)
include(CPack)
