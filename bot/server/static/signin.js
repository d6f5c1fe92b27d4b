/*
 * Sign-in page: carry the link's fragment (#char=a,b or #page=n) through sign-in,
 * then go on to the identity provider at once.
 *
 * A fragment never reaches the server, and the provider's consent page would
 * drop it, so it is added to the sign-in link as a query parameter; the server
 * checks it and puts it back on the document's URL after sign-in. Without
 * JavaScript the person clicks the link and lands on the document unhighlighted.
 */
(function () {
  "use strict";

  var FRAGMENT = /^(char|page)=[0-9A-Za-z,;=.\-]{0,200}$/;
  var link = document.getElementById("signin");
  if (!link) {
    return;
  }
  var fragment = window.location.hash.slice(1);
  if (FRAGMENT.test(fragment)) {
    link.href += "&fragment=" + encodeURIComponent(fragment);
  }
  window.location.replace(link.href);
})();
