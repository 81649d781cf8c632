// Tells altair's chart loader that the vendored libraries are present, so no chart fetches them from a CDN.
// Versions as altair 6.3.0 asks for them; refresh with `make vendor-vega`.
var VEGA_DEBUG = {vega_version: "6", vegalite_version: "6.4.1", vegaembed_version: "7"};
