"""The dashboard (``fsdpctl dashboard``) and the HTML report (``report --html``): every run on one local
page, live, safe by default. The one package with a web server in it (the standard library's)."""
