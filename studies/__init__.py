"""Research programmes built on jaxcredit: each folder holds one study's configs, runner,
report writer, committed results and a README of its findings. The library never imports
them."""
