"""The Debian mirror debootstrap uses, read from the host's apt sources in the shapes hosts have."""

from __future__ import annotations

from sandboxes.images import DEBIAN_SUITE, _debian_uris

SUITE = DEBIAN_SUITE


def test_deb822_sources_give_the_main_archive_not_security():
    text = (f"Types: deb\nURIs: http://deb.debian.org/debian\nSuites: {SUITE} {SUITE}-updates\n\n"
            f"Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: {SUITE}-security\n")
    assert list(_debian_uris(text)) == ["http://deb.debian.org/debian"]


def test_deb822_fields_in_any_order_and_comments_are_read():
    text = f"# a snapshot\nSuites: {SUITE}\nTypes: deb\nURIs: https://mirror.example.org/debian/\n"
    assert list(_debian_uris(text)) == ["https://mirror.example.org/debian/"]


def test_a_cloud_images_mirror_list_is_not_given_to_debootstrap():
    text = f"Types: deb\nURIs: mirror+file:///etc/apt/mirrors/debian.list\nSuites: {SUITE}\n"
    assert list(_debian_uris(text)) == []


def test_cdrom_lines_and_third_party_repositories_are_skipped():
    text = (f"deb cdrom:[Debian GNU/Linux 12]/ {SUITE} main\n"
            f"deb https://packages.cloud.google.com/apt cloud-sdk-{SUITE} main\n"
            f"deb [arch=amd64] http://ftp.de.debian.org/debian {SUITE} main\n")
    assert list(_debian_uris(text)) == ["http://ftp.de.debian.org/debian"]


def test_another_suite_is_not_taken_for_ours():
    assert list(_debian_uris("deb http://archive.ubuntu.com/ubuntu jammy main\n")) == []
    assert list(_debian_uris("deb http://deb.debian.org/debian trixie main\n")) == []
